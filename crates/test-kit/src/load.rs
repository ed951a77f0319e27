//! A bounded chat load through a router, for tests that change the fleet
//! under traffic and must lose no request.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use crate::{DEADLINE, eventually, stream_chat};

/// Workers (four unless told) streaming chats for one model through a
/// router until stopped (at most 400 each).
pub struct ChatLoad {
    stop: Arc<AtomicBool>,
    answered: Arc<AtomicU32>,
    workers: Vec<tokio::task::JoinHandle<(u32, Vec<String>)>>,
}

impl ChatLoad {
    pub fn start(http: &reqwest::Client, router: &str, model: &str) -> ChatLoad {
        Self::with_workers(http, router, model, 4)
    }

    pub fn with_workers(
        http: &reqwest::Client,
        router: &str,
        model: &str,
        workers: usize,
    ) -> ChatLoad {
        let stop = Arc::new(AtomicBool::new(false));
        let answered = Arc::new(AtomicU32::new(0));
        let workers = (0..workers)
            .map(|_| {
                let (http, router, model) = (http.clone(), router.to_owned(), model.to_owned());
                tokio::spawn(chat_worker(
                    http,
                    router,
                    model,
                    stop.clone(),
                    answered.clone(),
                ))
            })
            .collect();
        ChatLoad {
            stop,
            answered,
            workers,
        }
    }

    /// Requests finished so far, answered or failed.
    pub fn answered(&self) -> u32 {
        self.answered.load(Ordering::Relaxed)
    }

    pub async fn until_answered(&self, count: u32) {
        eventually(
            &format!("{count} chats through the router"),
            DEADLINE,
            || async {
                let answered = self.answered();
                if answered >= count {
                    Ok(())
                } else {
                    Err(format!("{answered} so far"))
                }
            },
        )
        .await;
    }

    /// Stops the workers; every request they made must have been answered.
    /// `during` names what the load went through, for the printed count.
    pub async fn stop_without_failures(self, during: &str) {
        self.stop.store(true, Ordering::Relaxed);
        let (mut ok, mut failed) = (0, Vec::new());
        for worker in self.workers {
            let (o, f) = worker.await.expect("a load worker ends");
            ok += o;
            failed.extend(f);
        }
        println!(
            "load through the router {during}: {ok} ok, {} failed",
            failed.len()
        );
        assert!(
            failed.is_empty(),
            "{} requests failed {during}: {failed:?}",
            failed.len()
        );
        assert!(ok >= 20, "the load loop ran: {ok} requests");
    }
}

/// Answered chats, and why the others failed.
async fn chat_worker(
    http: reqwest::Client,
    router: String,
    model: String,
    stop: Arc<AtomicBool>,
    answered: Arc<AtomicU32>,
) -> (u32, Vec<String>) {
    let (mut ok, mut failed) = (0u32, Vec::new());
    for _ in 0..400 {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        match stream_chat(&http, &router, &model).await {
            Ok(answer) if !answer.is_empty() => ok += 1,
            Ok(_) => failed.push("empty answer".to_owned()),
            Err(why) => failed.push(why),
        }
        answered.fetch_add(1, Ordering::Relaxed);
    }
    (ok, failed)
}
