//! A TCP proxy that delays every byte by a constant time each way: a slow
//! link between peers on one machine (this kernel has no netem). Runs on
//! a thread of its own, so it works under any test runtime; dropping it
//! closes the listener and every relayed connection.

use std::net::SocketAddr;
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

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
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let (stop, stopped) = oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            runtime.block_on(async move {
                let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
                    return;
                };
                let accept = async {
                    loop {
                        if let Ok((client, _)) = listener.accept().await {
                            tokio::spawn(relay(client, target, one_way));
                        }
                    }
                };
                tokio::select! {
                    _ = stopped => {}
                    () = accept => {}
                }
            });
        });
        Ok(DelayProxy {
            addr,
            stop: Some(stop),
            thread: Some(thread),
        })
    }
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

async fn relay(client: TcpStream, target: SocketAddr, one_way: Duration) {
    let Ok(server) = TcpStream::connect(target).await else {
        return;
    };
    let _ = (client.set_nodelay(true), server.set_nodelay(true));
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    tokio::join!(
        pipe(client_read, server_write, one_way),
        pipe(server_read, client_write, one_way)
    );
}

/// Copies `from` to `to`, each chunk written `delay` after it was read.
async fn pipe(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, delay: Duration) {
    let (held, mut due) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let read = async move {
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(n) = from.read(&mut buf).await {
            if n == 0
                || held
                    .send((Instant::now() + delay, buf[..n].to_vec()))
                    .is_err()
            {
                break;
            }
        }
    };
    let write = async move {
        while let Some((at, bytes)) = due.recv().await {
            tokio::time::sleep_until(at).await;
            if to.write_all(&bytes).await.is_err() {
                break;
            }
        }
        let _ = to.shutdown().await;
    };
    tokio::join!(read, write);
}
