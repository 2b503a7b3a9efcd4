//! The fleet service registry: each Microservice's Service resolvable by
//! name through CoreDNS's etcd plugin. `records.rs` decides what to write
//! (pure); `store.rs` talks to etcd; the reconciler registers, and on
//! deletion removes the records before it releases the finalizer;
//! `sweep.rs` removes what no Microservice stands behind any more.

pub mod records;
pub mod store;
pub mod sweep;

pub use records::FINALIZER;
pub use store::{Registry, RegistryConfig, RegistryError};

/// Registration as configured: on, or on but unusable (a bad zone, an
/// unreadable CA). Unusable keeps every finalizer on and says why in
/// `Registered`, rather than letting a typo release them all.
#[derive(Clone, Debug)]
pub enum Registration {
    /// Boxed: an etcd client is a few KiB, and settings are cloned.
    Ready(Box<Registry>),
    Broken(String),
}

impl Registration {
    pub async fn connect(config: &RegistryConfig) -> Registration {
        match Registry::connect(config).await {
            Ok(r) => {
                // Certificates rotate in place, as the gRPC server's do.
                r.watch_files(crate::serve::tls::RELOAD_PERIOD);
                Registration::Ready(Box::new(r))
            }
            Err(e) => {
                tracing::error!(error = %e, "the service registry is misconfigured; Microservices will show Registered=False");
                Registration::Broken(e.to_string())
            }
        }
    }

    pub fn get(&self) -> Result<&Registry, RegistryError> {
        match self {
            Registration::Ready(r) => Ok(r.as_ref()),
            Registration::Broken(m) => Err(RegistryError::Config(m.clone())),
        }
    }
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("zone", &self.zone().name)
            .finish_non_exhaustive()
    }
}
