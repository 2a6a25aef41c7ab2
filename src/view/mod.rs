//! `runner view`: a local web app over run folders — the runs newest first, a run's
//! episodes filtered and paged, an episode's trajectory, runs compared with the flips and
//! paired tests `runner compare` prints, two episodes of a task aligned turn by turn, a run
//! being written followed live, and labels people set in the page saved beside the run for
//! `runner judge-check`. Everything the page needs is built into the binary; it reaches
//! nothing beyond the viewer itself.

pub mod align;
pub mod api;
pub mod catalog;
pub mod labels;
pub mod live;
pub mod server;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use tokio::net::TcpListener;

/// A viewer bound to its address, ready to serve.
pub struct Bound {
    pub listener: TcpListener,
    pub viewer: Arc<server::Viewer>,
    pub url: String,
}

/// Binds `listen` and opens the catalog of `roots`: an error names a folder that is no run
/// and no folder of runs, or an address that cannot be had.
pub async fn bind(listen: SocketAddr, roots: Vec<PathBuf>) -> Result<Bound, String> {
    let catalog = catalog::Catalog::new(roots)?;
    let listener = TcpListener::bind(listen).await.map_err(|e| format!("failed to listen on {listen}: {e}"))?;
    let addr = listener.local_addr().map_err(|e| format!("failed to listen on {listen}: {e}"))?;
    let port = addr.port();
    // On a loopback address only its own names are answered; on another one, the names
    // the network gives the machine are not known here.
    let hosts = addr.ip().is_loopback().then(|| vec![addr.to_string(), format!("localhost:{port}")]);
    let user = std::env::var("USER").ok().filter(|u| !u.is_empty()).unwrap_or_else(|| "someone".into());
    let viewer = Arc::new(server::Viewer { catalog, hosts, user, writing: std::sync::Mutex::new(()) });
    let shown = if addr.ip().is_unspecified() { format!("127.0.0.1:{port}") } else { addr.to_string() };
    Ok(Bound { listener, viewer, url: format!("http://{shown}/") })
}
