//! A user and password for a registry: given by the operator or a tenant, read from
//! Docker's config, or made by an ECR login (`ecr`).

/// A user and password for a registry. Never printed.
#[derive(Clone)]
pub struct Credentials {
    /// The user.
    pub username: String,
    /// The password (or token).
    pub password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Credentials({:?}, <password>)", self.username)
    }
}
