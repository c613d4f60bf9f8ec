/work/main/target/debug/deps/cowlink_sys-616f47bf05a46858.d: crates/cowlink-sys/src/lib.rs

/work/main/target/debug/deps/libcowlink_sys-616f47bf05a46858.rlib: crates/cowlink-sys/src/lib.rs

/work/main/target/debug/deps/libcowlink_sys-616f47bf05a46858.rmeta: crates/cowlink-sys/src/lib.rs

crates/cowlink-sys/src/lib.rs:
