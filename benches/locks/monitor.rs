//! Counting the commands clients send, with `MONITOR` on a raw TCP connection.
//!
//! Redis echoes every command it executes to a monitoring connection, in execution
//! order, as `+<unix time> [<db> <client address>] "CMD" "arg" ...`. Commands a Lua
//! script runs are echoed too, with `lua` as the client (`[0 lua]`); those are not
//! round trips and are left out. A measurement is a window between two `ECHO` markers
//! sent by the benchmark itself, so nothing before or after it is counted.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One command as Redis executed it.
#[derive(Debug, Clone)]
pub struct Command {
    /// Server time, in seconds since the epoch.
    pub at: f64,
    /// Upper-case command name.
    pub name: String,
    /// The arguments after the name, unquoted (escapes are left as Redis wrote them).
    pub args: Vec<String>,
    /// True when a Lua script ran it.
    pub from_script: bool,
}

/// A running `MONITOR` connection.
pub struct Monitor {
    lines: Arc<Mutex<Vec<Command>>>,
    /// Lines are kept only while a window is open, so that the monitor's own memory
    /// does not grow between measurements (the watchdog scenario measures this process).
    recording: Arc<AtomicBool>,
    marker: redis::aio::MultiplexedConnection,
    next_mark: u64,
    /// Closed by [`Monitor::stop`]: while a monitor is attached, Redis copies every
    /// command to it, which slows every other measurement.
    stream: TcpStream,
}

impl Monitor {
    pub async fn start(port: u16, url: &str) -> Self {
        let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect for MONITOR");
        stream.write_all(b"MONITOR\r\n").expect("send MONITOR");
        let lines: Arc<Mutex<Vec<Command>>> = Arc::default();
        let sink = lines.clone();
        let recording = Arc::new(AtomicBool::new(false));
        let on = recording.clone();
        let reading = stream.try_clone().expect("clone the MONITOR stream");
        std::thread::spawn(move || {
            let reader = BufReader::new(reading);
            for line in reader.lines() {
                let Ok(line) = line else { return };
                if !on.load(Ordering::SeqCst) {
                    continue;
                }
                if let Some(command) = parse(&line) {
                    sink.lock().unwrap().push(command);
                }
            }
        });
        let marker = redis::Client::open(url)
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .expect("connect the marker connection");
        Monitor {
            lines,
            recording,
            marker,
            next_mark: 0,
            stream,
        }
    }

    /// Detaches from Redis.
    pub fn stop(self) {
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
    }

    /// Runs `work` and returns the commands Redis executed meanwhile.
    pub async fn record<F: Future<Output = T>, T>(&mut self, work: F) -> (T, Vec<Command>) {
        self.next_mark += 1;
        let start = format!("bench-mark-start-{}", self.next_mark);
        let end = format!("bench-mark-end-{}", self.next_mark);
        self.recording.store(true, Ordering::SeqCst);
        self.mark(&start).await;
        let output = work.await;
        self.mark(&end).await;
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            {
                let mut lines = self.lines.lock().unwrap();
                let is_mark = |c: &Command, text: &str| {
                    c.name == "ECHO" && c.args.first().is_some_and(|a| a == text)
                };
                if let Some(stop) = lines.iter().position(|c| is_mark(c, &end)) {
                    let begin = lines
                        .iter()
                        .position(|c| is_mark(c, &start))
                        .expect("the start marker precedes the end marker");
                    let window = lines[begin + 1..stop].to_vec();
                    lines.clear();
                    lines.shrink_to_fit();
                    self.recording.store(false, Ordering::SeqCst);
                    return (output, window);
                }
            }
            assert!(
                Instant::now() < deadline,
                "MONITOR never showed the end marker"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    async fn mark(&mut self, text: &str) {
        let _: String = redis::cmd("ECHO")
            .arg(text)
            .query_async(&mut self.marker)
            .await
            .expect("ECHO marker");
    }
}

/// Top-level commands (not those run by scripts), by name.
pub fn top_level(commands: &[Command]) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for command in commands.iter().filter(|c| !c.from_script) {
        *counts.entry(command.name.clone()).or_default() += 1;
    }
    counts
}

/// `EVALSHA 3 EVAL 1` style summary of a count by name.
pub fn summary(counts: &BTreeMap<String, usize>) -> String {
    counts
        .iter()
        .map(|(name, count)| format!("{name} {count}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn parse(line: &str) -> Option<Command> {
    let line = line.strip_prefix('+')?;
    let (time, rest) = line.split_once(' ')?;
    let at: f64 = time.parse().ok()?;
    let (client, rest) = rest.strip_prefix('[')?.split_once("] ")?;
    let from_script = client.ends_with(" lua");
    let mut words = quoted_words(rest).into_iter();
    let name = words.next()?.to_ascii_uppercase();
    Some(Command {
        at,
        name,
        args: words.collect(),
        from_script,
    })
}

/// Splits `"a" "b \" c"` into its quoted words.
fn quoted_words(text: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c != '"' {
            continue;
        }
        let mut word = String::new();
        while let Some(c) = chars.next() {
            match c {
                '\\' => {
                    if let Some(next) = chars.next() {
                        word.push('\\');
                        word.push(next);
                    }
                }
                '"' => break,
                c => word.push(c),
            }
        }
        words.push(word);
    }
    words
}
