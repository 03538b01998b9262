//! Whether the process is ready to take traffic, as `/ready` reports it.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Answers `/ready`: a cheap, non-blocking check asked once per request.
///
/// Cloning is cheap; clones ask the same check.
#[derive(Clone)]
pub struct Readiness(Arc<dyn Fn() -> bool + Send + Sync>, Option<Detail>);

/// A line `/ready` adds to its answer when there is something to say.
type Detail = Arc<dyn Fn() -> Option<String> + Send + Sync>;

impl Readiness {
    /// Ready whenever `check` returns `true`. `check` runs on the admin
    /// server's task for every `/ready` request, so it must not block.
    pub fn from_fn(check: impl Fn() -> bool + Send + Sync + 'static) -> Self {
        Self(Arc::new(check), None)
    }

    /// `/ready` also says what `detail` returns, when it returns a line
    /// (the status is still the check's).
    pub fn with_detail(self, detail: impl Fn() -> Option<String> + Send + Sync + 'static) -> Self {
        Self(self.0, Some(Arc::new(detail)))
    }

    /// The line to add to the answer, if any.
    pub fn detail(&self) -> Option<String> {
        self.1.as_ref().and_then(|d| d())
    }

    /// Ready while `flag` is `true`; flip the flag to change the answer.
    pub fn from_flag(flag: Arc<AtomicBool>) -> Self {
        Self::from_fn(move || flag.load(Ordering::Acquire))
    }

    /// Always ready.
    pub fn always() -> Self {
        Self::from_fn(|| true)
    }

    /// Whether the process is ready now.
    pub fn is_ready(&self) -> bool {
        (self.0)()
    }
}

impl From<Arc<dyn Fn() -> bool + Send + Sync>> for Readiness {
    fn from(check: Arc<dyn Fn() -> bool + Send + Sync>) -> Self {
        Self(check, None)
    }
}

impl fmt::Debug for Readiness {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Readiness").finish_non_exhaustive()
    }
}
