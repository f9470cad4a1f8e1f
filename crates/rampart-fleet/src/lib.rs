//! Rampart's fleet: many nodes behind one API, coordinated by etcd.
//!
//! - [`node::Membership`]: a node's record under a lease, renewed; its catalog entries kept
//!   true; the fleet's tenants mirrored into its store (`rampart serve --fleet`).
//! - [`gateway::Gateway`]: the front door (`rampart gateway`): the fleet's keys, placement,
//!   and every call that names a sandbox carried to its node.
//! - [`store::Store`]: everything the fleet keeps in etcd, and the only code that touches it.

pub mod gateway;
pub mod metrics;
pub mod model;
pub mod node;
pub mod store;
pub mod view;

pub use gateway::{Gateway, GatewayConfig, GatewayError};
pub use model::{Capacity, CatalogEntry, NodeRecord, TenantDef};
pub use node::{JoinError, Membership, NodeConfig, NodeFacts};
pub use store::{Store, StoreError, DEFAULT_PREFIX};
