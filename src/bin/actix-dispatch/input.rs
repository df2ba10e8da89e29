//! The reader thread of `actix-dispatch run`, and the `--unfinished` file
//! it shares with the result loop.
//!
//! The thread reads the input line by line into a bounded channel, so the
//! file is never held in memory. It ends in one of three ways
//! ([`ReadEnd`]): the input ended; reading failed (a directory, an I/O
//! error mid-file: the run must not look complete); or the run stopped
//! first (an interrupt, a closed stdout) and closed the channel. In the
//! last case, once the result loop has put the lines still in the channel
//! into `--unfinished`, it tells the thread whether to copy the rest of the
//! input there too, so that every task without a result is in that file,
//! in input order.

use std::fs::File;
use std::io::{self, BufRead, BufWriter, Write};
use std::sync::{mpsc as std_mpsc, Arc, Mutex, PoisonError};

use tokio::sync::mpsc;

/// One input line: its number and its bytes (end of line removed).
pub(crate) type Line = (u64, Vec<u8>);

/// How the reader thread ended.
pub(crate) enum ReadEnd {
    /// The input ended.
    Eof,
    /// Reading failed after line `after` (0: before the first).
    Failed { after: u64, error: io::Error },
    /// The run stopped first: lines from `first` on were not handed over;
    /// `kept` of them went to `--unfinished` (all of them unless `error`,
    /// a read error while copying them).
    Stopped {
        first: u64,
        kept: u64,
        error: Option<io::Error>,
    },
}

/// The `--unfinished` file (when asked for) and how many task lines went
/// to it, shared by the result loop and the reader thread.
pub(crate) type Unfinished = Arc<Mutex<UnfinishedFile>>;

/// See [`Unfinished`].
pub(crate) struct UnfinishedFile {
    file: Option<BufWriter<File>>,
    count: u64,
    error: Option<io::Error>,
}

impl UnfinishedFile {
    pub(crate) fn new(file: Option<BufWriter<File>>) -> Unfinished {
        Arc::new(Mutex::new(UnfinishedFile {
            file,
            count: 0,
            error: None,
        }))
    }

    /// Keeps a task line (the first write error is kept for the end).
    pub(crate) fn keep(&mut self, raw: &[u8]) {
        self.count += 1;
        if let Some(f) = self.file.as_mut() {
            let written = f.write_all(raw).and_then(|()| f.write_all(b"\n"));
            if let Err(e) = written {
                self.error.get_or_insert(e);
            }
        }
    }

    /// Task lines kept so far.
    pub(crate) fn count(&self) -> u64 {
        self.count
    }

    /// Whether there is a file to copy lines to.
    pub(crate) fn has_file(&self) -> bool {
        self.file.is_some()
    }

    /// Flushes the file; the first error of the run, if any.
    pub(crate) fn finish(&mut self) -> Result<(), io::Error> {
        if let Some(f) = self.file.as_mut() {
            if let Err(e) = f.flush() {
                self.error.get_or_insert(e);
            }
        }
        self.error.take().map_or(Ok(()), Err)
    }
}

/// Locks `u`, whatever a panicking holder left (a count and a file).
pub(crate) fn lock(u: &Unfinished) -> std::sync::MutexGuard<'_, UnfinishedFile> {
    u.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Reads one line into `buf` (end of line removed); `Ok(false)` at the end.
fn next_line(input: &mut dyn BufRead, buf: &mut Vec<u8>) -> io::Result<bool> {
    buf.clear();
    if input.read_until(b'\n', buf)? == 0 {
        return Ok(false);
    }
    while buf.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
        buf.pop();
    }
    Ok(true)
}

fn blank(line: &[u8]) -> bool {
    line.iter().all(u8::is_ascii_whitespace)
}

/// Reads lines into `tx` until the input ends, fails, or the receiver is
/// closed; then waits for `copy_rest` to say where the rest goes (`None`:
/// nowhere, it stays unread).
pub(crate) fn read_lines(
    mut input: Box<dyn BufRead + Send>,
    tx: mpsc::Sender<Line>,
    copy_rest: std_mpsc::Receiver<Option<Unfinished>>,
) -> ReadEnd {
    let mut buf = Vec::new();
    let mut n = 0u64;
    loop {
        match next_line(&mut *input, &mut buf) {
            Ok(true) => {}
            Ok(false) => return ReadEnd::Eof,
            Err(error) => return ReadEnd::Failed { after: n, error },
        }
        n += 1;
        if blank(&buf) {
            continue;
        }
        let Err(mpsc::error::SendError((first, line))) =
            tx.blocking_send((n, std::mem::take(&mut buf)))
        else {
            continue;
        };
        let Ok(Some(keep)) = copy_rest.recv() else {
            return ReadEnd::Stopped {
                first,
                kept: 0,
                error: None,
            };
        };
        let mut keep = lock(&keep);
        keep.keep(&line);
        let mut kept = 1;
        loop {
            match next_line(&mut *input, &mut buf) {
                Ok(true) if blank(&buf) => {}
                Ok(true) => {
                    keep.keep(&buf);
                    kept += 1;
                }
                Ok(false) => {
                    return ReadEnd::Stopped {
                        first,
                        kept,
                        error: None,
                    }
                }
                Err(e) => {
                    return ReadEnd::Stopped {
                        first,
                        kept,
                        error: Some(e),
                    }
                }
            }
        }
    }
}
