//! Progress bars on a terminal, nothing when stderr is piped or redirected.

use std::io::IsTerminal;
use std::sync::Mutex;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use opsched::schedule::Progress;

/// A bar for one long command. With `steps` (the schedulers of a comparison) the bar counts
/// steps and the search inside a step shows in its message; without, it counts the units the
/// search reports (IOS's operators).
pub struct Bar {
    bar: ProgressBar,
    counts_steps: bool,
    state: Mutex<StepState>,
}

#[derive(Default)]
struct StepState {
    label: String,
    started: bool,
    total: u64,
    done: u64,
    unit: String,
}

impl Bar {
    /// A bar over `steps` named steps, or over the units of one search when `steps` is `None`.
    pub fn new(steps: Option<u64>) -> Self {
        let bar = ProgressBar::with_draw_target(steps, draw_target());
        let template = if steps.is_some() {
            "{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} {msg}"
        } else {
            "{spinner} [{elapsed_precise}] {bar:30} {msg}"
        };
        if let Ok(style) = ProgressStyle::with_template(template) {
            bar.set_style(style);
        }
        bar.enable_steady_tick(Duration::from_millis(120));
        Bar {
            bar,
            counts_steps: steps.is_some(),
            state: Mutex::new(StepState::default()),
        }
    }

    /// Remove the bar from the terminal.
    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }

    fn redraw(&self, st: &StepState) {
        let search = if st.total > 0 {
            format!("{}/{} {}", st.done, st.total, st.unit)
        } else {
            String::new()
        };
        let msg = match (st.label.is_empty(), search.is_empty()) {
            (false, false) => format!("{}: {search}", st.label),
            (false, true) => st.label.clone(),
            (true, _) => search,
        };
        self.bar.set_message(msg);
    }
}

impl Drop for Bar {
    fn drop(&mut self) {
        self.bar.finish_and_clear();
    }
}

fn draw_target() -> ProgressDrawTarget {
    if std::io::stderr().is_terminal() {
        ProgressDrawTarget::stderr()
    } else {
        ProgressDrawTarget::hidden()
    }
}

impl Progress for Bar {
    fn step(&self, label: &str) {
        let Ok(mut st) = self.state.lock() else {
            return;
        };
        if self.counts_steps && st.started {
            self.bar.inc(1);
        }
        *st = StepState {
            label: label.to_string(),
            started: true,
            ..StepState::default()
        };
        self.redraw(&st);
    }

    fn begin(&self, total: u64, unit: &str) {
        let Ok(mut st) = self.state.lock() else {
            return;
        };
        st.total = total;
        st.done = 0;
        st.unit = unit.to_string();
        if !self.counts_steps {
            self.bar.set_length(total);
            self.bar.set_position(0);
        }
        self.redraw(&st);
    }

    fn advance(&self, done: u64) {
        let Ok(mut st) = self.state.lock() else {
            return;
        };
        st.done += done;
        if !self.counts_steps {
            self.bar.inc(done);
        }
        self.redraw(&st);
    }
}
