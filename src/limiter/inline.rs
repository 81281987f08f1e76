//! Finishing an in-process store's give-back or charge on the spot: it needs no I/O, so it
//! is mostly ready at once, and then its units are settled before the next request is
//! decided, with no task to wait for (and no runtime needed).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Wake, Waker};

/// Polls `work` here: once, and, when there is no tokio runtime to finish it in, again
/// while it wakes itself (it yielded), 16 polls at most. Whether it finished; if not, the
/// caller hands it to a task, or gives it up when there is no runtime.
fn finish_here(mut work: Pin<&mut (impl Future<Output = ()> + ?Sized)>, runtime: bool) -> bool {
    if work.as_mut().poll(&mut Context::from_waker(Waker::noop())).is_ready() {
        return true;
    }
    if runtime {
        return false; // the task's first poll registers its waker
    }
    // A wake-up sent to the no-op waker is lost: poll once more in any case.
    let woken = Arc::new(Woken(AtomicBool::new(true)));
    let waker = Waker::from(woken.clone());
    let mut cx = Context::from_waker(&waker);
    for _ in 0..16 {
        if !woken.0.swap(false, Ordering::Acquire) {
            return false;
        }
        if work.as_mut().poll(&mut cx).is_ready() {
            return true;
        }
    }
    false
}

/// Runs detached work: an in-process store's (`local`) finished here when it can be
/// ([`finish_here`]), else in a task of the current tokio runtime. `false`: there is no
/// runtime to finish it in, and it was given up.
pub(crate) fn detach(mut work: Pin<Box<impl Future<Output = ()> + Send + 'static>>, local: bool) -> bool {
    let runtime = tokio::runtime::Handle::try_current().ok();
    if local && finish_here(work.as_mut(), runtime.is_some()) {
        return true;
    }
    match runtime {
        Some(rt) => {
            drop(rt.spawn(work));
            true
        }
        None => false,
    }
}

/// Remembers a wake-up.
struct Woken(AtomicBool);

impl Wake for Woken {
    fn wake(self: Arc<Self>) {
        self.0.store(true, Ordering::Release);
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.store(true, Ordering::Release);
    }
}
