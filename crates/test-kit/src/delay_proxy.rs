//! A TCP proxy that delays every byte each way: a slow link between peers
//! on one machine (this kernel has no netem). The delay is a base time
//! plus a random jitter per chunk, never reordering bytes, and can be
//! changed while connections are open ([`LinkDelay`]). Runs on a thread
//! of its own, so it works under any test runtime, optionally inside a
//! network namespace; dropping it closes the listener and every relayed
//! connection.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

/// The delay of one direction of a link: `one_way` plus a uniform random
/// part in `[0, jitter)`, changeable at any time (a fault that starts and
/// heals without reconnecting anyone).
#[derive(Debug, Default)]
pub struct LinkDelay {
    one_way_us: AtomicU64,
    jitter_us: AtomicU64,
}

impl LinkDelay {
    pub fn new(one_way: Duration, jitter: Duration) -> Arc<LinkDelay> {
        let delay = Arc::new(LinkDelay::default());
        delay.set(one_way, jitter);
        delay
    }

    pub fn set(&self, one_way: Duration, jitter: Duration) {
        self.one_way_us
            .store(one_way.as_micros() as u64, Ordering::Relaxed);
        self.jitter_us
            .store(jitter.as_micros() as u64, Ordering::Relaxed);
    }

    /// The delay for the next chunk, with `random` a fresh 64-bit draw.
    fn sample(&self, random: u64) -> Duration {
        let jitter = self.jitter_us.load(Ordering::Relaxed);
        let extra = if jitter == 0 { 0 } else { random % jitter };
        Duration::from_micros(self.one_way_us.load(Ordering::Relaxed) + extra)
    }
}

pub struct DelayProxy {
    /// Where clients connect.
    pub addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl DelayProxy {
    /// Listens on a free port of 127.0.0.1 and relays each connection to
    /// `target`, every chunk held `one_way` in each direction (a round
    /// trip gains twice that), order kept.
    pub fn start(target: SocketAddr, one_way: Duration) -> std::io::Result<DelayProxy> {
        let listen = SocketAddr::from(([127, 0, 0, 1], 0));
        Self::start_in(
            None,
            listen,
            target,
            LinkDelay::new(one_way, Duration::ZERO),
        )
    }

    /// Listens on `listen` and relays each connection to `target` with
    /// `delay` each way. With `namespace` (a path such as
    /// `/var/run/netns/NAME`), the listener and every connection to
    /// `target` live in that network namespace: a proxy on a peer's own
    /// address, in front of its real port.
    pub fn start_in(
        namespace: Option<&Path>,
        listen: SocketAddr,
        target: SocketAddr,
        delay: Arc<LinkDelay>,
    ) -> std::io::Result<DelayProxy> {
        let namespace = namespace.map(Path::to_owned);
        let (bound, bound_rx) = std::sync::mpsc::channel::<std::io::Result<SocketAddr>>();
        let (stop, stopped) = oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            // Sockets belong to the namespace of the thread that makes
            // them, so the thread enters it before the runtime exists.
            let listener = namespace
                .as_deref()
                .map_or(Ok(()), enter_namespace)
                .and_then(|()| bind(listen));
            let runtime = listener.and_then(|listener| {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?;
                Ok((listener, runtime))
            });
            let (listener, runtime) = match runtime {
                Ok(ready) => ready,
                Err(e) => {
                    let _ = bound.send(Err(e));
                    return;
                }
            };
            let _ = bound.send(listener.local_addr());
            runtime.block_on(async move {
                let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
                    return;
                };
                let accept = async {
                    let mut connections = 0u64;
                    loop {
                        if let Ok((client, _)) = listener.accept().await {
                            connections += 1;
                            let seed = connections ^ seed_of(target);
                            tokio::spawn(relay(client, target, delay.clone(), seed));
                        }
                    }
                };
                tokio::select! {
                    _ = stopped => {}
                    () = accept => {}
                }
            });
        });
        let addr = bound_rx
            .recv()
            .map_err(|_| std::io::Error::other("the proxy thread ended before it listened"))??;
        Ok(DelayProxy {
            addr,
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

/// A jitter seed per target, so that proxies on one port differ.
fn seed_of(target: SocketAddr) -> u64 {
    let ip = match target.ip() {
        std::net::IpAddr::V4(ip) => u64::from(u32::from(ip)),
        std::net::IpAddr::V6(ip) => u128::from(ip) as u64,
    };
    (ip << 16 | u64::from(target.port())) << 16
}

fn bind(listen: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    let listener = std::net::TcpListener::bind(listen)?;
    listener.set_nonblocking(true)?;
    Ok(listener)
}

/// Moves the calling thread into the network namespace at `path`.
#[allow(unsafe_code)]
fn enter_namespace(path: &Path) -> std::io::Result<()> {
    let file = std::fs::File::open(path).map_err(|e| {
        std::io::Error::new(
            e.kind(),
            format!("network namespace {}: {e}", path.display()),
        )
    })?;
    // SAFETY: `setns` only reads the descriptor, which `file` keeps open
    // for the duration of the call.
    let rc = unsafe { libc::setns(std::os::fd::AsRawFd::as_raw_fd(&file), libc::CLONE_NEWNET) };
    if rc != 0 {
        let e = std::io::Error::last_os_error();
        return Err(std::io::Error::new(
            e.kind(),
            format!("cannot enter network namespace {}: {e}", path.display()),
        ));
    }
    Ok(())
}

impl Drop for DelayProxy {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

async fn relay(client: TcpStream, target: SocketAddr, delay: Arc<LinkDelay>, seed: u64) {
    let Ok(server) = TcpStream::connect(target).await else {
        return;
    };
    let _ = (client.set_nodelay(true), server.set_nodelay(true));
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    tokio::join!(
        pipe(client_read, server_write, delay.clone(), seed),
        pipe(server_read, client_write, delay, !seed)
    );
}

/// Copies `from` to `to`, each chunk written its sampled delay after it
/// was read, and never before the chunk read ahead of it. The end of the
/// stream is delayed the same way (an empty chunk), so a close takes as
/// long to cross as a byte.
async fn pipe(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, delay: Arc<LinkDelay>, seed: u64) {
    let (held, mut due) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let read = async move {
        let mut random = SplitMix(seed);
        let mut last_due = Instant::now();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = from.read(&mut buf).await.unwrap_or(0);
            let at = (Instant::now() + delay.sample(random.next())).max(last_due);
            last_due = at;
            if held.send((at, buf[..n].to_vec())).is_err() || n == 0 {
                break;
            }
        }
    };
    let write = async move {
        while let Some((at, bytes)) = due.recv().await {
            tokio::time::sleep_until(at).await;
            if bytes.is_empty() || to.write_all(&bytes).await.is_err() {
                break;
            }
        }
        let _ = to.shutdown().await;
    };
    tokio::join!(read, write);
}

/// A small seeded generator for the jitter (no dependency for one draw
/// per chunk).
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chunk_waits_the_base_delay_plus_at_most_the_jitter() {
        let delay = LinkDelay::new(Duration::from_millis(60), Duration::from_millis(10));
        let mut random = SplitMix(7);
        for _ in 0..1000 {
            let d = delay.sample(random.next());
            assert!(
                d >= Duration::from_millis(60) && d < Duration::from_millis(70),
                "{d:?}"
            );
        }
        delay.set(Duration::ZERO, Duration::ZERO);
        assert_eq!(delay.sample(random.next()), Duration::ZERO);
    }

    #[test]
    fn bytes_cross_a_delayed_link_in_order_and_late() {
        let runtime = tokio::runtime::Runtime::new().expect("a runtime");
        runtime.block_on(async {
            let echo = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind");
            let target = echo.local_addr().expect("addr");
            tokio::spawn(async move {
                let (mut socket, _) = echo.accept().await.expect("accept");
                let mut buf = [0u8; 1024];
                while let Ok(n) = socket.read(&mut buf).await {
                    if n == 0 || socket.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            });
            let delay = LinkDelay::new(Duration::from_millis(40), Duration::from_millis(20));
            let listen = SocketAddr::from(([127, 0, 0, 1], 0));
            let proxy = DelayProxy::start_in(None, listen, target, delay).expect("a proxy");
            let mut client = TcpStream::connect(proxy.addr).await.expect("connect");
            let started = std::time::Instant::now();
            let sent: Vec<u8> = (0..200u8).collect();
            for chunk in sent.chunks(10) {
                client.write_all(chunk).await.expect("write");
            }
            let mut echoed = vec![0u8; sent.len()];
            client.read_exact(&mut echoed).await.expect("read");
            assert_eq!(echoed, sent, "order kept across the jitter");
            assert!(
                started.elapsed() >= Duration::from_millis(80),
                "a round trip through the proxy took {:?}, under twice the delay",
                started.elapsed()
            );
        });
    }
}
