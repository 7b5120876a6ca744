//! Cluster launch without home-made orchestration.
//!
//! A process started by a launcher (Slurm's `srun`, Open MPI's `mpirun`, a
//! torchrun-style launcher, or plain environment variables) learns its rank,
//! the world size and where rank 0 listens from the environment
//! ([`detect`] / [`LaunchInfo::from_env`]); then [`rendezvous`] exchanges one
//! small blob per rank (a serialised engine address, a side-channel address)
//! over TCP at rank 0, and every rank gets all blobs in rank order.
//!
//! The environment parsing ([`env`]), Slurm's hostlist syntax ([`hostlist`])
//! and the wire format ([`wire`]) are pure functions, tested without
//! sockets; only [`rendezvous`](mod@rendezvous) touches the network, and
//! every wait there has a deadline and every buffer a limit ([`Limits`]).

mod error;

pub mod auth;
pub mod deadline;
pub mod env;
pub mod hostlist;
pub mod rendezvous;
pub mod wire;

pub use auth::JobSecret;
pub use env::{Convention, Endpoint, LaunchInfo, detect};
pub use error::{LaunchError, Result};
pub use rendezvous::{Options, rendezvous};
pub use wire::Limits;
