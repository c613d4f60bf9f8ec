//! A slow uplink: a TCP relay on 127.0.0.1 in front of a server that lets
//! a limited number of request bytes a second through each connection
//! (answers pass at full speed). For tests of work that must outlast a
//! deadline, such as a push busy with one object for longer than a
//! remote gc's grace period.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

/// Start a relay to `upstream` (`http://HOST:PORT`) letting at most
/// `rate` bytes a second of each connection's requests through; its
/// endpoint, `http://127.0.0.1:PORT`. Its threads end with the test
/// process.
pub fn slow_uplink(upstream: &str, rate: usize) -> String {
    let up: SocketAddr = upstream
        .trim_start_matches("http://")
        .parse()
        .expect("an http://HOST:PORT endpoint");
    let l = TcpListener::bind("127.0.0.1:0").expect("a free port");
    let addr = l.local_addr().expect("the relay's address");
    std::thread::spawn(move || {
        for c in l.incoming() {
            let Ok(c) = c else { return };
            let Ok(u) = TcpStream::connect(up) else {
                continue;
            };
            let (Ok(c2), Ok(u2)) = (c.try_clone(), u.try_clone()) else {
                continue;
            };
            std::thread::spawn(move || relay(c, u, Some(rate.max(1))));
            std::thread::spawn(move || relay(u2, c2, None));
        }
    });
    format!("http://{addr}")
}

fn relay(mut from: TcpStream, mut to: TcpStream, rate: Option<usize>) {
    let mut buf = vec![0u8; 16 << 10];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
        if let Some(r) = rate {
            std::thread::sleep(Duration::from_secs_f64(n as f64 / r as f64));
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}
