//! What the CLI tells the user besides the result: the files it wrote (`wrote x.svg (12 kB)`
//! on stderr, unless `--quiet`) and the libraries' warnings (`warning: ...` on stderr).
//!
//! A command computes, prints its result, and only then writes its files ([`Outputs`]), so a
//! write that fails (a missing folder, a full disk) loses nothing: the table is on the screen,
//! the error follows, and the exit code is 2.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Result;
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

use crate::error::user;

static QUIET: AtomicBool = AtomicBool::new(false);

/// `--quiet`: do not report written files.
pub fn set_quiet(quiet: bool) {
    QUIET.store(quiet, Ordering::Relaxed);
}

/// The files a command writes, held until its result has been printed.
#[derive(Default)]
pub struct Outputs {
    files: Vec<(PathBuf, Vec<u8>)>,
}

impl Outputs {
    /// Write `bytes` to `path` (`-`: stdout) when [`Outputs::write`] runs.
    pub fn add(&mut self, path: &Path, bytes: impl Into<Vec<u8>>) {
        self.files.push((path.to_path_buf(), bytes.into()));
    }

    /// Write every file through `opsched::io::write`, reporting each on stderr unless
    /// `--quiet`. Every file is tried; a failure is an error of the user's (exit code 2), the
    /// last one returned and any before it printed as their own `error:` lines.
    pub fn write(self) -> Result<()> {
        let mut failed: Option<String> = None;
        for (path, bytes) in self.files {
            match opsched::io::write(&path, &bytes) {
                Ok(w) => {
                    if !QUIET.load(Ordering::Relaxed) {
                        eprintln!("{w}");
                    }
                }
                // stdout closed by its reader (`| head`): their choice, not an error.
                Err(e) if e.kind == std::io::ErrorKind::BrokenPipe => {}
                Err(e) => {
                    if let Some(earlier) = failed.replace(e.to_string()) {
                        eprintln!("error: {earlier}");
                    }
                }
            }
        }
        match failed {
            Some(msg) => Err(user(anyhow::anyhow!(msg))),
            None => Ok(()),
        }
    }
}

/// Library events on stderr without `RUST_LOG`: `warning: message field=value`, one line each.
pub struct Plain;

impl<S, N> FormatEvent<S, N> for Plain
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> std::fmt::Result {
        let level = match *event.metadata().level() {
            Level::ERROR => "error",
            Level::WARN => "warning",
            _ => "note",
        };
        write!(writer, "{level}: ")?;
        ctx.field_format().format_fields(writer.by_ref(), event)?;
        writeln!(writer)
    }
}
