//! AUTH PLAIN and LOGIN: the SASL exchange up to a username and password
//! for the driver to verify, and the reply to its verdict. Whether AUTH is
//! allowed at all (TLS, or plaintext allowed by config) is decided here too.

use std::borrow::Cow;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use smtp_proto::{AUTH_LOGIN, AUTH_PLAIN};

use super::{Action, Session, State};
use crate::auth::AuthOutcome;
use crate::smtp::reply::Reply;

impl Session {
    pub(super) fn auth_allowed(&self) -> bool {
        self.tls || self.config.allow_plaintext_auth
    }

    pub(super) fn auth(&mut self, mechanism: u64, initial: Cow<'_, str>) -> Option<Action> {
        if self.account.is_some() {
            return self.bad_sequence("Already authenticated");
        }
        if self.envelope.is_some() {
            return self.bad_sequence("AUTH not allowed during a mail transaction");
        }
        if !self.auth_allowed() {
            self.write(Reply::new(
                538,
                "5.7.11",
                "Encryption required for requested authentication mechanism",
            ));
            return self.count_bad_command();
        }
        match mechanism {
            AUTH_PLAIN if initial.is_empty() => {
                self.write(Reply::new(334, "", ""));
                self.state = State::SaslPlain;
                None
            }
            AUTH_PLAIN => self.sasl_plain(initial.as_bytes()),
            AUTH_LOGIN if initial.is_empty() => {
                self.write(Reply::new(334, "", "VXNlcm5hbWU6"));
                self.state = State::SaslLoginUser;
                None
            }
            AUTH_LOGIN => self.sasl_login_user(initial.as_bytes()),
            _ => {
                self.write(Reply::new(
                    504,
                    "5.5.4",
                    "Unrecognized authentication mechanism",
                ));
                self.count_bad_command()
            }
        }
    }

    pub(super) fn sasl_plain(&mut self, response: &[u8]) -> Option<Action> {
        let decoded = match self.decode_sasl(response) {
            Ok(d) => d,
            Err(action) => return action,
        };
        // authzid NUL authcid NUL password; we ignore authzid.
        let mut fields = decoded.split(|&b| b == 0);
        let (Some(_), Some(user), Some(pass), None) =
            (fields.next(), fields.next(), fields.next(), fields.next())
        else {
            self.write(Reply::new(501, "5.5.2", "Malformed AUTH PLAIN response"));
            return self.count_bad_command();
        };
        self.authenticate(user, pass)
    }

    pub(super) fn sasl_login_user(&mut self, response: &[u8]) -> Option<Action> {
        let user = match self.decode_sasl(response) {
            Ok(d) => d,
            Err(action) => return action,
        };
        let username = String::from_utf8_lossy(&user).into_owned();
        self.write(Reply::new(334, "", "UGFzc3dvcmQ6"));
        self.state = State::SaslLoginPassword { username };
        None
    }

    pub(super) fn sasl_login_password(
        &mut self,
        username: String,
        response: &[u8],
    ) -> Option<Action> {
        match self.decode_sasl(response) {
            Ok(pass) => self.authenticate(username.as_bytes(), &pass),
            Err(action) => action,
        }
    }

    fn decode_sasl(&mut self, response: &[u8]) -> Result<Vec<u8>, Option<Action>> {
        if response == b"*" {
            self.write(Reply::new(501, "5.7.0", "Authentication cancelled"));
            // Moves nothing forward: without a count, AUTH and `*` could
            // be repeated for ever.
            return Err(self.count_junk());
        }
        if response == b"=" {
            return Ok(Vec::new());
        }
        BASE64.decode(response).map_err(|_| {
            self.write(Reply::new(501, "5.5.2", "Invalid base64 in AUTH response"));
            self.count_bad_command()
        })
    }

    fn authenticate(&mut self, user: &[u8], pass: &[u8]) -> Option<Action> {
        let (Ok(username), Ok(password)) = (std::str::from_utf8(user), std::str::from_utf8(pass))
        else {
            self.write(Reply::new(
                535,
                "5.7.8",
                "Authentication credentials invalid",
            ));
            return self.count_bad_command();
        };
        self.state = State::Waiting;
        Some(Action::Authenticate {
            username: username.to_owned(),
            password: password.to_owned(),
        })
    }

    pub fn auth_result(&mut self, outcome: AuthOutcome) {
        self.state = State::Command;
        match outcome {
            AuthOutcome::Success(account) => {
                self.account = Some(account);
                self.write(Reply::new(235, "2.7.0", "Authentication successful"));
            }
            AuthOutcome::Invalid => {
                self.write(Reply::new(
                    535,
                    "5.7.8",
                    "Authentication credentials invalid",
                ));
                self.count_bad_command();
            }
            // No hash was checked for these: counted, or AUTH could be
            // repeated for ever against a locked account or a full queue.
            AuthOutcome::TemporaryFailure => {
                self.write(Reply::new(
                    454,
                    "4.7.0",
                    "Temporary authentication failure, try again later",
                ));
                self.junk_limit_reached();
            }
            AuthOutcome::AccountLocked => {
                self.write(Reply::new(
                    454,
                    "4.7.0",
                    "Too many failed logins for this account, try again later",
                ));
                self.junk_limit_reached();
            }
            AuthOutcome::IpBanned => {
                self.write(Reply::new(
                    421,
                    "4.7.0",
                    "Too many failed logins from your address, closing connection",
                ));
                self.state = State::Closed;
            }
        }
    }
}
