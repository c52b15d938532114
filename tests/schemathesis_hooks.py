"""schemathesis hooks for tests/http_schemathesis.rs (loaded through
SCHEMATHESIS_HOOKS): send generated message/rfc822 bodies as they are, bytes
on the wire, like application/octet-stream."""

import schemathesis

schemathesis.serializer.alias("message/rfc822", "application/octet-stream")
