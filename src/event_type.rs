//! Ground floor: the delivery-status event types that webhooks carry, as
//! config filters and producers name them. Imports no crate module.

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventType {
    Accepted,
    Delivered,
    Deferred,
    /// Failed for good (a 5xx, or refused before sending): a bounce.
    Bounced,
    /// Still deferred when the message reached its maximum age.
    Expired,
    /// An operator or the application cancelled it (API `DELETE`, CLI
    /// `cancel`).
    Cancelled,
    /// Held by an operator: not attempted until released.
    Held,
    /// Released from hold: attempted again.
    Released,
    /// Made due now by an operator (`retry`): its attempt follows.
    Retried,
}

impl EventType {
    pub const ALL: [EventType; 9] = [
        EventType::Accepted,
        EventType::Delivered,
        EventType::Deferred,
        EventType::Bounced,
        EventType::Expired,
        EventType::Cancelled,
        EventType::Held,
        EventType::Released,
        EventType::Retried,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Accepted => "message.accepted",
            EventType::Delivered => "message.delivered",
            EventType::Deferred => "message.deferred",
            EventType::Bounced => "message.bounced",
            EventType::Expired => "message.expired",
            EventType::Cancelled => "message.cancelled",
            EventType::Held => "message.held",
            EventType::Released => "message.released",
            EventType::Retried => "message.retried",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.as_str() == s)
    }

    /// The event a recipient's attempt outcome (`delivery_attempt.outcome`)
    /// reports.
    pub fn of_outcome(outcome: &str) -> Option<Self> {
        Some(match outcome {
            "delivered" => EventType::Delivered,
            "deferred" => EventType::Deferred,
            "failed" => EventType::Bounced,
            "expired" => EventType::Expired,
            _ => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for t in EventType::ALL {
            assert_eq!(EventType::parse(t.as_str()), Some(t));
        }
        assert_eq!(EventType::parse("message.sent"), None);
        assert_eq!(EventType::of_outcome("failed"), Some(EventType::Bounced));
        assert_eq!(EventType::of_outcome("held"), None);
    }
}
