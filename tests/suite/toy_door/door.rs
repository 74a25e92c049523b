//! The line door: a toy agent door made outside the crate, as a new family's door would be.
//!
//! An agent connects over loopback TCP, sends one line `{"cwd": "<its folder>"}`, then speaks
//! JSON-RPC (the pi dialect), one message a line; it gets the core's messages back the same
//! way. Everything else (routing by cwd, the editor's link, ids, notifications) is the core's.

use futures_util::SinkExt;
use pi_ide_broker::frontdoor::plugin::{open_session, AgentDoor, DoorTask};
use pi_ide_broker::protocol::family::Family;
use pi_ide_broker::registry::Registry;
use pi_ide_broker::session::{Door, Intro};
use pi_ide_broker::sys::config::Config;
use pi_ide_broker::wire::wsframe::{Frame, Out};
use serde_json::Value;
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

/// How the line door's sessions show in `status`.
pub const LINE: Door = Door::Plugged {
    name: "line",
    answers_editor_requests: false,
};

/// The door; it tells its port once it listens.
pub struct LineDoor {
    port: Mutex<Option<oneshot::Sender<u16>>>,
}

impl LineDoor {
    /// The door, and where its port arrives.
    pub fn new() -> (LineDoor, oneshot::Receiver<u16>) {
        let (tx, rx) = oneshot::channel();
        (
            LineDoor {
                port: Mutex::new(Some(tx)),
            },
            rx,
        )
    }
}

impl AgentDoor for LineDoor {
    fn name(&self) -> &'static str {
        "line"
    }

    fn enabled(&self, _config: &Config) -> bool {
        true
    }

    fn run(&self, reg: Arc<Registry>) -> DoorTask {
        let tell = self.port.lock().ok().and_then(|mut p| p.take());
        Box::pin(async move {
            let Ok(listener) = TcpListener::bind("127.0.0.1:0").await else {
                return;
            };
            if let (Some(tell), Ok(addr)) = (tell, listener.local_addr()) {
                let _ = tell.send(addr.port());
            }
            loop {
                tokio::select! {
                    _ = reg.cancel.cancelled() => return,
                    conn = listener.accept() => if let Ok((stream, _)) = conn {
                        tokio::spawn(serve(reg.clone(), stream));
                    },
                }
            }
        })
    }
}

/// One agent: its cwd line, then lines both ways until either side ends.
async fn serve(reg: Arc<Registry>, stream: TcpStream) {
    let (rd, mut wr) = stream.into_split();
    let mut lines = BufReader::new(rd).lines();
    let Ok(Some(hello)) = lines.next_line().await else {
        return;
    };
    let Some(cwd) = serde_json::from_str::<Value>(&hello)
        .ok()
        .and_then(|v| v["cwd"].as_str().map(String::from))
    else {
        return;
    };
    let intro = Intro {
        door: LINE,
        cwd,
        key: None,
        editor: None,
        remote: None,
        pinned: false,
        inherit: None,
        family: Family::Pi,
        client: None,
        realm: None,
    };
    let mut link = open_session(&reg, intro);
    loop {
        tokio::select! {
            line = lines.next_line() => match line {
                Ok(Some(text)) => if link.writer.send(Out::Text(text)).await.is_err() { return },
                _ => return,
            },
            frame = link.reader.next() => match frame {
                Ok(Some(Frame::Text(t))) => {
                    let out = format!("{t}\n");
                    if wr.write_all(out.as_bytes()).await.is_err() { return }
                }
                Ok(Some(Frame::Ping(p))) => {
                    let pong = Out::Pong(p.to_vec());
                    if link.writer.send(pong).await.is_err() { return }
                }
                Ok(Some(_)) => {}
                _ => return,
            },
        }
    }
}
