//! Polling a rarely-ready future only when it has woken its task.
//!
//! A `select!` loop polls every branch on every turn. For a branch that fires once in a
//! connection's life (its cancellation), each of those polls takes two locks (the token's
//! state, its waiter list) to learn nothing. [`WhenWoken`] registers the inner future with a
//! waker of its own that raises a flag before waking the task, and skips the inner poll while
//! the flag is down.
//!
//! Kept, measured against its removal: the daemon takes 11,593 instructions per echo call with
//! it and 12,677 with `WhenWoken` a plain pass-through (+9.3 %, `benches/instructions.sh`;
//! benches/README.md, "Crates against the hand-written parts").

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

/// `inner`, polled only on the task's first turn, after it woke the task, after it was ready
/// (a channel may hold more), after it was changed through [`WhenWoken::inner_mut`], or when
/// the task's waker changed. Only for futures that wake their waker before they become ready
/// (those of tokio's `Notify`, `mpsc` and `Sleep`, and tokio-util's `CancellationToken` do).
pub struct WhenWoken<F> {
    inner: F,
    /// The waker the inner future holds, and the task waker it forwards to.
    flag: Option<(Arc<Flag>, Waker)>,
}

/// Raised by a wake of the inner future; forwards the wake to the task.
struct Flag {
    woken: AtomicBool,
    task: Waker,
}

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        self.task.wake_by_ref();
    }
}

impl<F> WhenWoken<F> {
    /// Wraps `inner`.
    pub fn new(inner: F) -> Self {
        WhenWoken { inner, flag: None }
    }

    /// The inner future, to change it (e.g. a timer's deadline). Marks it to be polled on the
    /// next turn: a changed future may need to register its waker afresh.
    pub fn inner_mut(&mut self) -> &mut F {
        if let Some((flag, _)) = &self.flag {
            flag.woken.store(true, Ordering::Release);
        }
        &mut self.inner
    }

    /// The inner future, to read it.
    pub fn inner(&self) -> &F {
        &self.inner
    }
}

impl<F: Future + Unpin> Future for WhenWoken<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.get_mut();
        let waker = match &this.flag {
            Some((flag, waker)) if flag.task.will_wake(cx.waker()) => {
                if !flag.woken.swap(false, Ordering::AcqRel) {
                    return Poll::Pending;
                }
                waker.clone()
            }
            _ => {
                let flag = Arc::new(Flag {
                    woken: AtomicBool::new(false),
                    task: cx.waker().clone(),
                });
                let waker = Waker::from(flag.clone());
                this.flag = Some((flag, waker.clone()));
                waker
            }
        };
        let out = Pin::new(&mut this.inner).poll(&mut Context::from_waker(&waker));
        if out.is_ready() {
            // Polled again next turn: a channel may hold more than the item it woke for.
            if let Some((flag, _)) = &this.flag {
                flag.woken.store(true, Ordering::Release);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// Counts the wakes of the task.
    struct Task(AtomicUsize);
    impl Wake for Task {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Counts its polls; ready once `open`.
    struct Gate {
        polls: usize,
        open: Arc<AtomicBool>,
        waker: Arc<std::sync::Mutex<Option<Waker>>>,
    }
    impl Future for Gate {
        type Output = ();
        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            self.polls += 1;
            if self.open.load(Ordering::SeqCst) {
                return Poll::Ready(());
            }
            *self.waker.lock().unwrap() = Some(cx.waker().clone());
            Poll::Pending
        }
    }

    /// A closed gate behind `WhenWoken`, its switch, and the waker it holds once polled.
    #[allow(clippy::type_complexity)]
    fn gate() -> (
        WhenWoken<Gate>,
        Arc<AtomicBool>,
        Arc<std::sync::Mutex<Option<Waker>>>,
    ) {
        let open = Arc::new(AtomicBool::new(false));
        let slot = Arc::new(std::sync::Mutex::new(None::<Waker>));
        let f = WhenWoken::new(Gate {
            polls: 0,
            open: open.clone(),
            waker: slot.clone(),
        });
        (f, open, slot)
    }

    #[test]
    fn the_inner_future_is_polled_only_after_it_woke_the_task() {
        let (mut f, open, slot) = gate();
        let task = Arc::new(Task(AtomicUsize::new(0)));
        let waker = Waker::from(task.clone());
        let mut cx = Context::from_waker(&waker);
        for _ in 0..5 {
            assert!(Pin::new(&mut f).poll(&mut cx).is_pending());
        }
        assert_eq!(f.inner.polls, 1, "polled once, to register");
        // It becomes ready and wakes: the task is woken and the next turn polls it.
        open.store(true, Ordering::SeqCst);
        slot.lock().unwrap().take().unwrap().wake();
        assert_eq!(task.0.load(Ordering::SeqCst), 1);
        assert!(Pin::new(&mut f).poll(&mut cx).is_ready());
        assert_eq!(f.inner.polls, 2);
    }

    #[test]
    fn a_changed_inner_future_is_polled_once_on_the_next_turn() {
        let (mut f, _open, _slot) = gate();
        let waker = Waker::from(Arc::new(Task(AtomicUsize::new(0))));
        let mut cx = Context::from_waker(&waker);
        assert!(Pin::new(&mut f).poll(&mut cx).is_pending());
        assert!(Pin::new(&mut f).poll(&mut cx).is_pending());
        assert_eq!(f.inner().polls, 1);
        // Changed (as a timer is reset): it must register again.
        f.inner_mut().polls = 10;
        assert!(Pin::new(&mut f).poll(&mut cx).is_pending());
        assert_eq!(f.inner().polls, 11, "polled after the change");
        assert!(Pin::new(&mut f).poll(&mut cx).is_pending());
        assert_eq!(f.inner().polls, 11, "and only once");
    }

    #[test]
    fn a_new_task_waker_registers_again() {
        let (mut f, _open, slot) = gate();
        let first = Waker::from(Arc::new(Task(AtomicUsize::new(0))));
        let second_task = Arc::new(Task(AtomicUsize::new(0)));
        let second = Waker::from(second_task.clone());
        assert!(Pin::new(&mut f)
            .poll(&mut Context::from_waker(&first))
            .is_pending());
        assert!(Pin::new(&mut f)
            .poll(&mut Context::from_waker(&second))
            .is_pending());
        assert_eq!(f.inner.polls, 2);
        slot.lock().unwrap().take().unwrap().wake();
        assert_eq!(
            second_task.0.load(Ordering::SeqCst),
            1,
            "the new task is woken"
        );
    }

    #[tokio::test]
    async fn every_queued_item_of_a_channel_is_received() {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let mut next = WhenWoken::new(std::future::poll_fn(|cx| rx.poll_recv(cx)));
        tx.send(1).unwrap();
        tx.send(2).unwrap();
        tx.send(3).unwrap();
        // One wake for three items: each is still received.
        for want in 1..=3 {
            let got = tokio::time::timeout(std::time::Duration::from_secs(5), &mut next).await;
            assert_eq!(got.expect("an item queued before"), Some(want));
        }
    }

    #[tokio::test]
    async fn a_cancelled_token_ends_the_wait() {
        let token = tokio_util::sync::CancellationToken::new();
        let (polled, mut first_poll) = tokio::sync::mpsc::unbounded_channel();
        let waiter = {
            let token = token.clone();
            tokio::spawn(async move {
                let wait = token.cancelled();
                tokio::pin!(wait);
                let mut f = WhenWoken::new(wait);
                std::future::poll_fn(|cx| {
                    let _ = polled.send(());
                    Pin::new(&mut f).poll(cx)
                })
                .await
            })
        };
        // Cancelled only once the waiter has registered (and gone to sleep).
        first_poll.recv().await;
        token.cancel();
        tokio::time::timeout(std::time::Duration::from_secs(5), waiter)
            .await
            .expect("the wait ends once the token is cancelled")
            .unwrap();
    }
}
