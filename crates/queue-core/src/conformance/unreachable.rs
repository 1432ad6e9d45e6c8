//! Addresses on loopback that no server answers, for the connection-failure tests of
//! every network transport: a closed port (refused at once) and a black hole (the
//! connection attempt is never answered).

use std::io;
use std::net::{SocketAddr, TcpListener as StdListener, TcpStream};

use tokio::net::{TcpListener, TcpSocket};

/// A port on 127.0.0.1 that nothing listens on: bound, read, and closed again.
pub fn closed_port() -> io::Result<u16> {
    let listener = StdListener::bind("127.0.0.1:0")?;
    let port = listener.local_addr()?.port();
    drop(listener);
    Ok(port)
}

/// A port on 127.0.0.1 whose connection attempts are never answered, as behind a
/// firewall that drops packets: a listener with an accept queue of one that never
/// accepts, its queue already taken, so the kernel ignores further SYNs. Needs a tokio
/// runtime; the hole closes when this value is dropped.
#[derive(Debug)]
pub struct BlackHole {
    _listener: TcpListener,
    _queued: TcpStream,
    /// The port that swallows connection attempts.
    pub port: u16,
}

impl BlackHole {
    /// Opens a black hole on a free port of 127.0.0.1.
    pub fn open() -> io::Result<Self> {
        let socket = TcpSocket::new_v4()?;
        socket.bind(SocketAddr::from(([127, 0, 0, 1], 0)))?;
        let listener = socket.listen(0)?;
        let port = listener.local_addr()?.port();
        let queued = TcpStream::connect(("127.0.0.1", port))?;
        Ok(BlackHole {
            _listener: listener,
            _queued: queued,
            port,
        })
    }
}
