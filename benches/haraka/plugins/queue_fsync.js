// queue_fsync: a minimal durable queue for Haraka, for benches/compare.sh.
//
// Each message is written to its own file and fsync'd before the 250 reply
// (next(OK)), which is what "queued" means for smtp-once and Postfix too.
// Nothing is ever delivered. The directory comes from config/queue_fsync.ini:
//
//   [main]
//   dir=/path/to/spool
//
// One file per message, named after the transaction uuid, so compare.sh can
// check that every acknowledged message is on disk by counting files.

'use strict'

const fs = require('node:fs')
const path = require('node:path')

exports.register = function () {
    this.cfg = this.config.get('queue_fsync.ini', () => this.register())
    this.dir = this.cfg.main.dir
    if (!this.dir) throw new Error('queue_fsync: set [main] dir in config/queue_fsync.ini')
    fs.mkdirSync(this.dir, { recursive: true })
    // Relayed mail (relay_acl_allow) goes through queue_outbound, the rest
    // through queue: store both the same way.
    this.register_hook('queue', 'store')
    this.register_hook('queue_outbound', 'store')
}

exports.store = function (next, connection) {
    const txn = connection?.transaction
    if (!txn) return next()
    const file = path.join(this.dir, `${txn.uuid}.eml`)
    const fail = (step, err) => {
        connection.logerror(this, `${step} ${file}: ${err.message}`)
        next(DENYSOFT, 'queue_fsync: cannot store the message')
    }
    // The envelope first (like a queue file), then the message as received.
    const envelope = Buffer.from(
        `X-Envelope-From: ${txn.mail_from.format()}\r\n` +
            `X-Envelope-To: ${txn.rcpt_to.map((r) => r.format()).join(', ')}\r\n`,
    )
    txn.message_stream.get_data((body) => {
        fs.open(file, 'wx', 0o600, (err, fd) => {
            if (err) return fail('open', err)
            fs.writev(fd, [envelope, body], (err) => {
                if (err) return fs.close(fd, () => fail('write', err))
                fs.fsync(fd, (err) => {
                    if (err) return fs.close(fd, () => fail('fsync', err))
                    fs.close(fd, (err) => {
                        if (err) return fail('close', err)
                        next(OK)
                    })
                })
            })
        })
    })
}
