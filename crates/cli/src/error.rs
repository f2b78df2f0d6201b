//! Which errors are the user's (exit code 2) and which are ours (exit code 1).

/// An error caused by the user's input (bad arguments, file or model name): exit code 2.
#[derive(Debug)]
pub struct UserError(String);

impl std::fmt::Display for UserError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UserError {}

/// Mark an error as the user's fault, keeping its whole message on one line.
pub fn user<E: Into<anyhow::Error>>(e: E) -> anyhow::Error {
    anyhow::Error::new(UserError(format!("{:#}", e.into())))
}

/// A facade error: the user's fault or not, as the facade says.
pub fn facade(e: opsched::Error) -> anyhow::Error {
    if e.is_user_error() {
        user(e)
    } else {
        anyhow::Error::new(e)
    }
}
