/work/main/target/debug/libcowlink_sys.rlib: /work/main/crates/cowlink-sys/src/lib.rs
