//! Labels that follow an async task: the set is installed around every poll of the future,
//! on whichever thread of the runtime polls it, and the thread's previous set is put back
//! after, so a task keeps its labels as it moves between threads and other tasks polled on
//! the same threads keep theirs.

use super::LabelSet;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

/// A future polled with a label set installed ([`WithLabels::with_labels`]).
#[derive(Debug)]
#[must_use = "futures do nothing unless polled"]
pub struct Labelled<F> {
    set: &'static LabelSet,
    inner: F,
}

impl<F: Future> Future for Labelled<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        // SAFETY: `inner` is pinned with `self` (structural pinning): it is never moved out,
        // and `Labelled` has no `Drop` or `Unpin` of its own that would move it.
        let this = unsafe { self.get_unchecked_mut() };
        let _labels = this.set.enter();
        // SAFETY: as above.
        unsafe { Pin::new_unchecked(&mut this.inner) }.poll(cx)
    }
}

/// Puts a label set on a future's polls.
pub trait WithLabels: Future + Sized {
    /// This future, polled with `set` installed on the polling thread.
    fn with_labels(self, set: &'static LabelSet) -> Labelled<Self> {
        Labelled { set, inner: self }
    }
}

impl<F: Future> WithLabels for F {}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::task::{Wake, Waker};

    struct Noop;
    impl Wake for Noop {
        fn wake(self: Arc<Self>) {}
    }

    #[test]
    fn each_poll_sees_the_set_and_the_thread_gets_its_own_back() {
        let set = LabelSet::new(&[("task", "t1")]);
        let outside = LabelSet::new(&[("task", "outside")]);
        let mut polls = 0;
        let mut fut = std::pin::pin!(std::future::poll_fn(|_| {
            polls += 1;
            assert_eq!(super::super::current_id(), set.id());
            if polls < 3 {
                Poll::Pending
            } else {
                Poll::Ready(polls)
            }
        })
        .with_labels(set));
        let waker = Waker::from(Arc::new(Noop));
        let mut cx = Context::from_waker(&waker);
        let _guard = outside.enter();
        loop {
            if let Poll::Ready(n) = fut.as_mut().poll(&mut cx) {
                assert_eq!(n, 3);
                break;
            }
            assert_eq!(super::super::current_id(), outside.id());
        }
    }
}
