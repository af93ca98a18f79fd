//! What the benchmark reads from the machine: memory, redis-benchmark, a description.

use std::process::Command;

/// This process's resident set size in bytes (`VmRSS` of `/proc/self/status`).
pub fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| {
            rest.trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .ok()
        })
        .map_or(0, |kib| kib * 1024)
}

/// CPU seconds this process has used (user + system, from `/proc/self/stat`).
pub fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the parenthesised command name; utime and stime are the 14th and 15th.
    let rest = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = [11, 12]
        .iter()
        .filter_map(|&i| fields.get(i)?.parse::<f64>().ok())
        .sum();
    ticks / clock_ticks_per_second()
}

/// CPU seconds the live threads of this process have run, in nanoseconds' resolution
/// (the first field of each `/proc/self/task/*/schedstat`), where [`cpu_seconds`]
/// counts 10 ms ticks: for runs too short for ticks. Threads that ended are not counted.
pub fn thread_cpu_seconds() -> f64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0.0;
    };
    let nanos: u64 = tasks
        .filter_map(Result::ok)
        .filter_map(|task| std::fs::read_to_string(task.path().join("schedstat")).ok())
        .filter_map(|stat| stat.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    nanos as f64 / 1e9
}

fn clock_ticks_per_second() -> f64 {
    run("getconf", &["CLK_TCK"]).parse().unwrap_or(100.0)
}

/// Runs `redis-benchmark` against `port` with `args` (a command and its arguments
/// after the options) and returns the requests per second it reports.
pub fn redis_benchmark(port: u16, options: &[&str], command: &[&str]) -> Result<f64, String> {
    let output = Command::new("redis-benchmark")
        .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-q"])
        .args(options)
        .args(command)
        .output()
        .map_err(|error| format!("run redis-benchmark: {error}"))?;
    let text = String::from_utf8_lossy(&output.stdout);
    // `-q` prints progress lines ending in `\r`, then `<name>: N requests per second, ...`.
    text.split(['\r', '\n'])
        .filter_map(|line| {
            let (before, _) = line.split_once(" requests per second")?;
            before.rsplit(' ').next()?.parse::<f64>().ok()
        })
        .next_back()
        .ok_or_else(|| {
            format!(
                "no result from redis-benchmark: {text} {}",
                String::from_utf8_lossy(&output.stderr)
            )
        })
}

/// One line about the machine: CPU model, cores, kernel.
pub fn machine() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|line| line.strip_prefix("model name"))
        .and_then(|rest| rest.split_once(':'))
        .map_or("unknown CPU".to_owned(), |(_, model)| {
            model.trim().to_owned()
        });
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let kernel = run("uname", &["-srm"]);
    format!("{model}, {cores} cores available, {kernel}")
}

/// The current UTC date and time.
pub fn now() -> String {
    run("date", &["-u", "+%Y-%m-%d %H:%M UTC"])
}

/// The commit the benchmark was built from, `+` when the tree had changes (empty
/// outside a git checkout).
pub fn commit() -> String {
    let commit = run("git", &["rev-parse", "--short", "HEAD"]);
    if commit.is_empty() {
        return commit;
    }
    let dirty = !run("git", &["status", "--porcelain", "--untracked-files=no"]).is_empty();
    format!("{commit}{}", if dirty { "+" } else { "" })
}

fn run(program: &str, args: &[&str]) -> String {
    Command::new(program)
        .args(args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}
