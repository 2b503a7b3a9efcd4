//! Chainable test fixtures: `ms("api").image("x:1").port(8080).build()`.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::crd::{Microservice, MicroserviceSpec, MicroserviceStatus};

pub struct MsBuilder(Microservice);

pub fn ms(name: &str) -> MsBuilder {
    MsBuilder(Microservice {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("default".into()),
            uid: Some(format!("uid-{name}")),
            generation: Some(1),
            ..ObjectMeta::default()
        },
        spec: MicroserviceSpec {
            image: "registry.example.com/team/app:1.0.0".into(),
            port: 8080,
            replicas: 2,
            env: Vec::new(),
        },
        status: None,
    })
}

impl MsBuilder {
    pub fn image(mut self, image: &str) -> Self {
        self.0.spec.image = image.into();
        self
    }
    pub fn port(mut self, port: i32) -> Self {
        self.0.spec.port = port;
        self
    }
    pub fn replicas(mut self, replicas: i32) -> Self {
        self.0.spec.replicas = replicas;
        self
    }
    pub fn env(mut self, name: &str, value: &str) -> Self {
        self.0.spec.env.push(crate::crd::EnvEntry {
            name: name.into(),
            value: value.into(),
        });
        self
    }
    pub fn uid(mut self, uid: &str) -> Self {
        self.0.metadata.uid = Some(uid.into());
        self
    }
    pub fn generation(mut self, generation: i64) -> Self {
        self.0.metadata.generation = Some(generation);
        self
    }
    pub fn status(mut self, status: MicroserviceStatus) -> Self {
        self.0.status = Some(status);
        self
    }
    pub fn build(self) -> Microservice {
        self.0
    }
}
