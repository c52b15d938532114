#!/usr/bin/env bash
# Regenerates the self-signed DEVELOPMENT certificate. Never use it in production.
# CA:FALSE so rustls/webpki accept it as an end-entity certificate when a test trusts it directly.
set -euo pipefail
cd "$(dirname "$0")"
openssl req -x509 -newkey rsa:2048 -nodes -sha256 -days 3650 \
  -keyout dev-key.pem -out dev-cert.pem \
  -subj "/CN=relay.example.test" \
  -addext "subjectAltName=DNS:relay.example.test,DNS:localhost,IP:127.0.0.1" \
  -addext "basicConstraints=critical,CA:FALSE" \
  -addext "keyUsage=critical,digitalSignature,keyEncipherment" \
  -addext "extendedKeyUsage=serverAuth"
