// Load for benchmarks/collab_bench.py, run as two processes so that reading the crowd's traffic
// cannot delay the timings:
//  - mode "crowd": human typists on plain `ws` sockets, each with its own Y.Doc (they send
//    keystrokes and read, but do not apply, what they receive);
//  - mode "timed": a few observers (stock WebsocketProvider clients) that also type at human speed,
//    plus the fast typist; they time how long every keystroke of theirs takes to reach the others.
// Prints one JSON line of results.
// Usage: node load.js '{"mode":"crowd"|"timed", "urlPrefix":..., "room":..., "query":"token=...",
//                       "humans":N, "seconds":10, "humanMs":400, "fastMs":30, "observers":4,
//                       "warmupMs":1000}'
// Both print "ready" once connected; the timed clients start on a line on stdin, the crowd types
// until its stdin is closed.
const Y = require('yjs')
const { WebsocketProvider } = require('y-websocket')
const WebSocket = require('ws')
const encoding = require('lib0/encoding')
const syncProtocol = require('y-protocols/sync')

const cfg = JSON.parse(process.argv[2])
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))
const sentAt = new Map() // "client:clock" -> ms
const latencies = []
let received = 0

function updateMessage (update) {
  const encoder = encoding.createEncoder()
  encoding.writeVarUint(encoder, 0)
  syncProtocol.writeUpdate(encoder, update)
  return encoding.toUint8Array(encoder)
}

function keystroke (doc, text, char) {
  const clock = Y.getState(doc.store, doc.clientID)
  sentAt.set(`${doc.clientID}:${clock}`, performance.now())
  text.insert(Math.floor(Math.random() * (text.length + 1)), char)
}

function human () {
  const doc = new Y.Doc()
  const text = doc.getText('content')
  const ws = new WebSocket(`${cfg.urlPrefix}/${cfg.room}${cfg.query ? '?' + cfg.query : ''}`)
  ws.binaryType = 'arraybuffer'
  ws.on('message', () => { received++ })
  doc.on('update', (update) => { if (ws.readyState === WebSocket.OPEN) ws.send(updateMessage(update)) })
  const opened = new Promise((resolve, reject) => { ws.on('open', resolve); ws.on('error', reject) })
  return { doc, text, ws, opened }
}

function provider () {
  const doc = new Y.Doc()
  const params = {}
  if (cfg.query) for (const part of cfg.query.split('&')) { const [k, v] = part.split('='); params[k] = decodeURIComponent(v) }
  const p = new WebsocketProvider(cfg.urlPrefix, cfg.room, doc, { WebSocketPolyfill: WebSocket, params, disableBc: true })
  return { doc, text: doc.getText('content'), provider: p }
}

function observe (o) {
  o.doc.on('update', (update, origin) => {
    if (origin !== o.provider) return
    const now = performance.now()
    for (const struct of Y.decodeUpdate(update).structs) {
      if (struct.id.client === o.doc.clientID) continue
      for (let clock = struct.id.clock; clock < struct.id.clock + struct.length; clock++) {
        const key = `${struct.id.client}:${clock}`
        const t = sentAt.get(key)
        if (t !== undefined) latencies.push(now - t)
      }
    }
  })
}

let stopping = false

async function typeLoop (doc, text, char, meanMs, until) {
  while (performance.now() < until && !stopping) {
    await sleep(meanMs * (0.5 + Math.random()))
    keystroke(doc, text, char)
  }
}

async function crowd () {
  const humans = []
  for (let i = 0; i < cfg.humans; i++) {
    humans.push(human())
    if (i % 20 === 19) await sleep(50) // do not open hundreds of sockets in one burst
  }
  await Promise.all(humans.map((h) => h.opened))
  process.stdout.write('ready\n')
  // Type until the benchmark closes our stdin (after the timed clients are done).
  process.stdin.on('end', () => { stopping = true })
  process.stdin.resume()
  const start = performance.now()
  await Promise.all(humans.map((h) => typeLoop(h.doc, h.text, 'h', cfg.humanMs, Infinity)))
  const elapsed = (performance.now() - start) / 1000
  process.stdout.write(JSON.stringify({ keystrokes: sentAt.size, messagesPerSec: received / elapsed }) + '\n')
  for (const h of humans) h.ws.close()
  process.exit(0)
}

async function timed () {
  const observers = Array.from({ length: cfg.observers }, provider)
  const fast = provider()
  const all = [...observers, fast]
  const deadline = Date.now() + 30000
  while (!all.every((o) => o.provider.synced)) {
    if (Date.now() > deadline) throw new Error('observers did not sync')
    await sleep(20)
  }
  all.forEach(observe)
  // Connected before the crowd arrives; start once the benchmark says "go" on stdin.
  process.stdout.write('ready\n')
  await new Promise((resolve) => process.stdin.once('data', resolve))
  await sleep(cfg.warmupMs)
  const lags = []
  let tick = performance.now()
  const lagTimer = setInterval(() => { const now = performance.now(); lags.push(now - tick - 10); tick = now }, 10)
  const until = performance.now() + cfg.seconds * 1000
  await Promise.all([
    typeLoop(fast.doc, fast.text, 'f', cfg.fastMs, until),
    ...observers.map((o) => typeLoop(o.doc, o.text, 'o', cfg.humanMs, until))
  ])
  await sleep(2000) // let the last keystrokes arrive
  clearInterval(lagTimer)
  lags.sort((a, b) => a - b)
  latencies.sort((a, b) => a - b)
  const q = (p) => latencies.length ? latencies[Math.min(latencies.length - 1, Math.floor(p * latencies.length))] : null
  process.stdout.write(JSON.stringify({
    keystrokes: sentAt.size,
    samples: latencies.length,
    expectedSamples: sentAt.size * (all.length - 1),
    p50: q(0.5),
    p99: q(0.99),
    max: latencies.length ? latencies[latencies.length - 1] : null,
    loopLagP99: lags[Math.floor(0.99 * lags.length)]
  }) + '\n')
  for (const o of all) o.provider.destroy()
  process.exit(0)
}

(cfg.mode === 'crowd' ? crowd : timed)().catch((err) => { console.error(err); process.exit(1) })
