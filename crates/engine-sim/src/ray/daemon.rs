//! The node daemons: the head keeps the node table (GPUs per node) on the
//! GCS port; a worker registers and stays connected until the head goes.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

use super::{DEFAULT_PORT, runtime};

/// The node daemon: `head|worker IP PORT HEAD_ADDR GPUS TEMP_DIR`.
pub fn daemon_main(args: &[String]) -> i32 {
    let [role, ip, port, head_addr, gpus, dir] = args else {
        eprintln!("ray daemon: bad arguments {args:?}");
        return 2;
    };
    let gpus: u64 = gpus.parse().unwrap_or(0);
    let dir = PathBuf::from(dir);
    let rt = match runtime() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("ray daemon: {e}");
            return 1;
        }
    };
    rt.block_on(async move {
        if role == "head" {
            let listener =
                match TcpListener::bind(("0.0.0.0", port.parse::<u16>().unwrap_or(DEFAULT_PORT)))
                    .await
                {
                    Ok(l) => l,
                    Err(_) => return 1,
                };
            let _ = std::fs::write(dir.join("ray_current_cluster"), format!("{ip}:{port}\n"));
            record_pid(&dir);
            head_daemon(listener, ip.clone(), gpus).await;
            0
        } else {
            let Ok(mut stream) = TcpStream::connect(head_addr.as_str()).await else {
                return 1;
            };
            if stream
                .write_all(format!("NODE {ip} {gpus}\n").as_bytes())
                .await
                .is_err()
            {
                return 1;
            }
            record_pid(&dir);
            // Stay registered until the head goes away.
            let mut buf = [0u8; 64];
            loop {
                match tokio::io::AsyncReadExt::read(&mut stream, &mut buf).await {
                    Ok(0) | Err(_) => return 1,
                    Ok(_) => {}
                }
            }
        }
    })
}

fn record_pid(dir: &std::path::Path) {
    use std::io::Write;
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("llmgw-sim-ray-pids"))
    {
        let _ = writeln!(f, "{}", std::process::id());
    }
}

type NodeTable = Arc<Mutex<HashMap<u64, (String, u64)>>>;

async fn head_daemon(listener: TcpListener, ip: String, gpus: u64) {
    let nodes: NodeTable = Arc::new(Mutex::new(HashMap::new()));
    if let Ok(mut table) = nodes.lock() {
        table.insert(0, (ip, gpus));
    }
    let mut next_id = 1u64;
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let nodes = nodes.clone();
        let id = next_id;
        next_id += 1;
        tokio::spawn(async move {
            let mut reader = BufReader::new(stream);
            let mut line = String::new();
            if reader.read_line(&mut line).await.unwrap_or(0) == 0 {
                return;
            }
            let parts: Vec<&str> = line.split_whitespace().collect();
            match parts.as_slice() {
                ["NODE", ip, gpus] => {
                    if let Ok(mut table) = nodes.lock() {
                        table.insert(id, (ip.to_string(), gpus.parse().unwrap_or(0)));
                    }
                    let mut sink = String::new();
                    while reader.read_line(&mut sink).await.unwrap_or(0) > 0 {
                        sink.clear();
                    }
                    if let Ok(mut table) = nodes.lock() {
                        table.remove(&id);
                    }
                }
                ["STATUS"] => {
                    let listing: Vec<String> = match nodes.lock() {
                        Ok(table) => {
                            let mut rows: Vec<_> = table.iter().collect();
                            rows.sort_by_key(|(id, _)| **id);
                            rows.into_iter()
                                .map(|(id, (ip, g))| format!("{id} {ip} {g}"))
                                .collect()
                        }
                        Err(_) => Vec::new(),
                    };
                    let _ = reader
                        .get_mut()
                        .write_all(format!("{}\nEND\n", listing.join("\n")).as_bytes())
                        .await;
                }
                _ => {}
            }
        });
    }
}
