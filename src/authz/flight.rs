//! One review per question at a time. Sixteen calls of a token never seen
//! would otherwise send sixteen identical TokenReviews to the home
//! apiserver; those that ask while one runs share its answer instead.

use std::collections::HashMap;
use std::future::Future;
use std::hash::Hash;
use std::sync::{Arc, Mutex};

use tokio::sync::OnceCell;

pub struct Flights<K, V> {
    running: Mutex<HashMap<K, Arc<OnceCell<V>>>>,
}

impl<K: Eq + Hash + Clone, V: Clone> Default for Flights<K, V> {
    fn default() -> Self {
        Flights {
            running: Mutex::new(HashMap::new()),
        }
    }
}

impl<K: Eq + Hash + Clone, V: Clone> Flights<K, V> {
    /// `ask`'s answer, or the answer of the same question already being
    /// asked. If the caller asking is dropped, a waiting one asks in its
    /// place (its own `ask`), so no waiter is left without an answer.
    pub async fn share<F: Future<Output = V>>(&self, key: K, ask: F) -> V {
        let cell = lock(&self.running).entry(key.clone()).or_default().clone();
        let flight = Leaving {
            flights: self,
            key,
            cell,
        };
        flight.cell.get_or_init(|| ask).await.clone()
    }

    /// Questions being asked now.
    pub fn len(&self) -> usize {
        lock(&self.running).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Forgets a flight when its caller leaves, answered or dropped: an
/// answered one, since the next question is a new flight (the answer is in
/// the caller's cache by then, or was a failure); an unanswered one when
/// no caller waits on it any more, so cancelled calls leave nothing behind.
struct Leaving<'a, K: Eq + Hash + Clone, V> {
    flights: &'a Flights<K, V>,
    key: K,
    cell: Arc<OnceCell<V>>,
}

impl<K: Eq + Hash + Clone, V> Drop for Leaving<'_, K, V> {
    fn drop(&mut self) {
        let mut running = lock(&self.flights.running);
        let ours = running
            .get(&self.key)
            .is_some_and(|c| Arc::ptr_eq(c, &self.cell));
        // The map's reference and this one: nobody else waits.
        let alone = Arc::strong_count(&self.cell) <= 2;
        if ours && (self.cell.initialized() || alone) {
            running.remove(&self.key);
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn callers_asking_at_once_share_one_answer() {
        let flights = Arc::new(Flights::<&str, usize>::default());
        let asked = Arc::new(AtomicUsize::new(0));
        let calls = (0..16).map(|_| {
            let (flights, asked) = (flights.clone(), asked.clone());
            tokio::spawn(async move {
                flights
                    .share("token", async {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        asked.fetch_add(1, Ordering::SeqCst) + 1
                    })
                    .await
            })
        });
        let answers: Vec<usize> = futures::future::join_all(calls)
            .await
            .into_iter()
            .map(|r| r.unwrap())
            .collect();
        assert_eq!(asked.load(Ordering::SeqCst), 1);
        assert!(answers.iter().all(|a| *a == 1), "{answers:?}");
        assert!(flights.is_empty(), "a finished flight is forgotten");
        // Asked again afterwards: a new flight.
        let again = flights.share("token", async { 7 }).await;
        assert_eq!(again, 7);
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_dropped_alone_leaves_no_flight_behind() {
        let flights = Arc::new(Flights::<u32, u8>::default());
        for key in 0..100 {
            let f = flights.clone();
            let call =
                tokio::spawn(async move { f.share(key, std::future::pending::<u8>()).await });
            tokio::time::sleep(Duration::from_millis(1)).await;
            call.abort();
            let _ = call.await;
        }
        assert!(flights.is_empty(), "{} flights left", flights.len());
    }

    #[tokio::test(start_paused = true)]
    async fn different_questions_fly_apart() {
        let flights = Flights::<u8, u8>::default();
        let (a, b) = tokio::join!(
            flights.share(1, async {
                tokio::time::sleep(Duration::from_millis(10)).await;
                1
            }),
            flights.share(2, async { 2 })
        );
        assert_eq!((a, b), (1, 2));
    }

    #[tokio::test(start_paused = true)]
    async fn a_dropped_asker_leaves_the_question_to_a_waiter() {
        let flights = Arc::new(Flights::<&str, u8>::default());
        let first = {
            let flights = flights.clone();
            tokio::spawn(async move {
                flights
                    .share("token", async {
                        std::future::pending::<()>().await;
                        1
                    })
                    .await
            })
        };
        tokio::time::sleep(Duration::from_millis(1)).await;
        let second = {
            let flights = flights.clone();
            tokio::spawn(async move { flights.share("token", async { 2 }).await })
        };
        tokio::time::sleep(Duration::from_millis(1)).await;
        first.abort();
        let answer = tokio::time::timeout(Duration::from_secs(1), second)
            .await
            .expect("the waiter is not left hanging")
            .unwrap();
        assert_eq!(answer, 2);
    }
}
