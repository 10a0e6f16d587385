//! A TCP proxy on a free loopback port that can hold back what the server
//! sends: each chunk of an answer reaches the client a set delay after the
//! proxy received it, while requests pass at once. The server acts on time
//! and the client learns late, as behind a congested or stalled link. It
//! can also swallow the requests that carry a given text (and what follows
//! them on their connection), as a middlebox that holds back streamed
//! answers does: the client waits for an answer that never comes. Or it
//! can be cut, as a network is: nothing passes either way any more, on the
//! connections it carries and on new ones, and none is closed.

use std::io::{Read as _, Write as _};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

pub struct DelayingProxy {
    pub port: u16,
    delay: Arc<Mutex<Duration>>,
    swallowed: Arc<Mutex<Option<Vec<u8>>>>,
    cut: Arc<AtomicBool>,
    closed: Arc<AtomicBool>,
}

impl DelayingProxy {
    /// Forwards to `upstream` (`host:port`), with no delay until one is set.
    pub fn start(upstream: &str) -> DelayingProxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let delay = Arc::new(Mutex::new(Duration::ZERO));
        let swallowed = Arc::new(Mutex::new(None));
        let cut = Arc::new(AtomicBool::new(false));
        let closed = Arc::new(AtomicBool::new(false));
        let (shared, swallowing, severed, done, upstream) = (
            Arc::clone(&delay),
            Arc::clone(&swallowed),
            Arc::clone(&cut),
            Arc::clone(&closed),
            upstream.to_string(),
        );
        thread::spawn(move || {
            // Connections accepted once cut: kept open, and silent.
            let mut stranded = Vec::new();
            for client in listener.incoming() {
                if done.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(client) = client else { return };
                if severed.load(Ordering::SeqCst) {
                    stranded.push(client);
                    continue;
                }
                let Ok(server) = TcpStream::connect(&upstream) else {
                    continue;
                };
                link(
                    client,
                    server,
                    Arc::clone(&shared),
                    Arc::clone(&swallowing),
                    Arc::clone(&severed),
                );
            }
        });
        DelayingProxy {
            port,
            delay,
            swallowed,
            cut,
            closed,
        }
    }

    /// `127.0.0.1:<port>`.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Answers received from now on reach the client `by` later.
    pub fn delay_answers(&self, by: Duration) {
        *self.delay.lock().unwrap() = by;
    }

    /// From now on, a request that carries `text` never reaches the
    /// server, nor does anything after it on its connection.
    pub fn swallow_requests_with(&self, text: &str) {
        *self.swallowed.lock().unwrap() = Some(text.as_bytes().to_vec());
    }

    /// From now on nothing passes, either way, on any connection: what was
    /// sent is lost, and no connection is closed or refused.
    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
    }
}

impl Drop for DelayingProxy {
    fn drop(&mut self) {
        self.closed.store(true, Ordering::SeqCst);
        // Wakes the accepting thread so that it sees it is closed.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

/// Carries one connection: requests straight through (but those it is to
/// swallow); answers through a queue that releases each chunk at its time.
/// Once `cut`, neither passes.
fn link(
    client: TcpStream,
    server: TcpStream,
    delay: Arc<Mutex<Duration>>,
    swallowed: Arc<Mutex<Option<Vec<u8>>>>,
    cut: Arc<AtomicBool>,
) {
    let cut_answers = Arc::clone(&cut);
    let (mut client_in, mut client_out) = (client.try_clone().unwrap(), client);
    let (mut server_in, mut server_out) = (server.try_clone().unwrap(), server);
    thread::spawn(move || {
        let mut buffer = [0u8; 16384];
        let mut swallowing = false;
        while let Ok(n @ 1..) = client_in.read(&mut buffer) {
            let chunk = &buffer[..n];
            swallowing = swallowing
                || swallowed
                    .lock()
                    .unwrap()
                    .as_ref()
                    .is_some_and(|text| chunk.windows(text.len()).any(|w| w == &text[..]));
            if swallowing || cut.load(Ordering::SeqCst) {
                continue;
            }
            if server_out.write_all(chunk).is_err() {
                break;
            }
        }
        let _ = server_out.shutdown(Shutdown::Write);
    });
    let (chunks, queued) = mpsc::channel::<(Instant, Vec<u8>)>();
    thread::spawn(move || {
        let mut buffer = [0u8; 16384];
        while let Ok(n @ 1..) = server_in.read(&mut buffer) {
            if cut_answers.load(Ordering::SeqCst) {
                continue;
            }
            let due = Instant::now() + *delay.lock().unwrap();
            if chunks.send((due, buffer[..n].to_vec())).is_err() {
                return;
            }
        }
    });
    thread::spawn(move || {
        for (due, chunk) in queued {
            thread::sleep(due.saturating_duration_since(Instant::now()));
            if client_out.write_all(&chunk).is_err() {
                return;
            }
        }
        let _ = client_out.shutdown(Shutdown::Both);
    });
}
