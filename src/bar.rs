//! Progress bars on stderr for the library's long operations.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Draws one bar per phase; hidden when stderr is not a terminal.
pub struct Bars {
    bar: Option<ProgressBar>,
}

impl Bars {
    pub fn new() -> Bars {
        Bars { bar: None }
    }
}

impl graphs::Progress for Bars {
    fn start(&mut self, phase: &str, total: u64) {
        let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
        let template = if total > 0 {
            "{msg:>36} [{bar:30}] {human_pos}/{human_len} ({per_sec}, {eta})"
        } else {
            "{msg:>36} {spinner} {human_pos}"
        };
        bar.set_style(
            ProgressStyle::with_template(template)
                .expect("valid template")
                .progress_chars("=> "),
        );
        bar.set_message(phase.to_string());
        self.bar = Some(bar);
    }
    fn advance(&mut self, n: u64) {
        if let Some(b) = &self.bar {
            b.inc(n);
        }
    }
    fn finish(&mut self) {
        if let Some(b) = self.bar.take() {
            b.finish_and_clear();
        }
    }
}
