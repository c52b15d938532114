// tcp_nodelay: turn off Nagle's algorithm on every inbound connection.
//
// Haraka writes each SMTP reply with its own write() and leaves Nagle on
// (its socket wrapper's setNoDelay() is a no-op). With a client that
// pipelines MAIL/RCPT/DATA, the RCPT and DATA replies then wait for the
// ACK of the MAIL reply, which the client delays by ~40 ms: Haraka drops to
// ~175 msgs/s at 8 connections on loopback. Postfix coalesces pipelined
// replies into one write and smtp-once sets TCP_NODELAY, so giving Haraka
// the same keeps the comparison about queueing, not about a TCP stall.
// compare.sh lists this plugin unless HARAKA_NODELAY=0.

'use strict'

exports.hook_connect_init = function (next, connection) {
    const sock = connection?.client?.targetsocket ?? connection?.client
    if (sock && typeof sock.setNoDelay === 'function') sock.setNoDelay(true)
    next()
}
