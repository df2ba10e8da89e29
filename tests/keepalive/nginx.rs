//! nginx as a backend: found on the PATH (or in the usual sbin
//! directories), run in the foreground with a config in a temporary
//! directory, stopped when dropped.

use std::fmt::Write as _;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Set by `.ci/run`: a missing nginx fails the test instead of skipping it.
const REQUIRE: &str = "ACTIX_DISPATCH_REQUIRE_NGINX";

/// nginx's path; `None` (with a note) when it is not installed, a panic
/// when `ACTIX_DISPATCH_REQUIRE_NGINX=1`.
pub fn find_or_require() -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    dirs.extend(["/usr/sbin", "/usr/local/sbin", "/usr/local/nginx/sbin"].map(PathBuf::from));
    let found = dirs
        .into_iter()
        .map(|d| d.join("nginx"))
        .find(|p| p.is_file());
    if found.is_none() {
        assert!(
            std::env::var(REQUIRE).as_deref() != Ok("1"),
            "{REQUIRE}=1 but nginx is not installed (bench/install-nginx.sh installs it)"
        );
        eprintln!("nginx not installed: skipped (bench/install-nginx.sh installs it)");
    }
    found
}

/// Free ports on 127.0.0.1 (bound together, then released for nginx).
fn free_ports(n: usize) -> Result<Vec<u16>, String> {
    let ls: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0").map_err(|e| format!("bind: {e}")))
        .collect::<Result<_, _>>()?;
    ls.iter()
        .map(|l| l.local_addr().map(|a| a.port()).map_err(|e| e.to_string()))
        .collect()
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|v| v.split_whitespace().nth(1).map(|e| e == "0"))
        })
        .unwrap_or(false)
}

/// One nginx process serving `n` ports, each answering `200 ok` to any
/// request itself.
pub struct Nginx {
    child: Child,
    dir: PathBuf,
    ports: Vec<u16>,
}

impl Nginx {
    /// Starts nginx with `http_extra` (directives) in its `http` block.
    pub fn start(bin: &std::path::Path, n: usize, http_extra: &str) -> Result<Nginx, String> {
        let ports = free_ports(n)?;
        let dir = std::env::temp_dir().join(format!(
            "actix-dispatch-test-nginx-{}-{}",
            std::process::id(),
            ports[0]
        ));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let d = dir.display();
        let mut servers = String::new();
        for p in &ports {
            let _ = writeln!(
                servers,
                "    server {{ listen 127.0.0.1:{p}; location / {{ return 200 \"ok\"; }} }}"
            );
        }
        let user = if is_root() { "user root;\n" } else { "" };
        let conf = format!(
            "{user}worker_processes 1;
error_log {d}/error.log warn;
pid {d}/nginx.pid;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {d}/body;
    {http_extra}
{servers}}}
"
        );
        let conf_path = dir.join("nginx.conf");
        std::fs::write(&conf_path, conf).map_err(|e| format!("{}: {e}", conf_path.display()))?;
        let child = Command::new(bin)
            .arg("-p")
            .arg(&dir)
            .arg("-e")
            .arg(dir.join("error.log"))
            .arg("-c")
            .arg(&conf_path)
            .arg("-g")
            .arg("daemon off;")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", bin.display()))?;
        let mut nginx = Nginx { child, dir, ports };
        for _ in 0..250 {
            if let Ok(Some(status)) = nginx.child.try_wait() {
                let log = std::fs::read_to_string(nginx.dir.join("error.log")).unwrap_or_default();
                return Err(format!("nginx exited at once ({status}): {log}"));
            }
            let up = nginx.ports.iter().all(|p| {
                let addr: SocketAddr = ([127, 0, 0, 1], *p).into();
                TcpStream::connect_timeout(&addr, Duration::from_millis(50)).is_ok()
            });
            if up {
                return Ok(nginx);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err("nginx did not listen within 5 s".into())
    }

    /// `http://127.0.0.1:PORT/` of each server.
    pub fn urls(&self) -> Vec<String> {
        self.ports
            .iter()
            .map(|p| format!("http://127.0.0.1:{p}/"))
            .collect()
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        // SIGTERM: the master stops its worker and exits.
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status();
        for _ in 0..150 {
            if let Ok(Some(_)) = self.child.try_wait() {
                let _ = std::fs::remove_dir_all(&self.dir);
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
