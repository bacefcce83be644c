// Many stock Yjs clients edit one file at random, drop and resume their connections, then wait
// until they all agree. Prints {text, inserted, deleted} as JSON for the test to check.
// Client i connects to urls[i % urls.length] (several replicas share the room).
// Usage: node fuzz.js '{"urls":[...], "project":..., "file":..., "clients":8, "seconds":8, "tokens":[...]}'
const Y = require('yjs')
const { WebsocketProvider } = require('y-websocket')
const WebSocket = require('ws')

const cfg = JSON.parse(process.argv[2])
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))
const pick = (items) => items[Math.floor(Math.random() * items.length)]
const flavours = ['', '😀', 'é', '中文', '🦊👍', 'ß∑', '\u200d']

const inserted = []
const deleted = new Set()
const markerPattern = /\n⟦[^⟧]*⟧/g

function makeClient (index) {
  const doc = new Y.Doc()
  const provider = new WebsocketProvider(`${cfg.urls[index % cfg.urls.length]}/ws/collab/${cfg.project}`, cfg.file, doc, {
    WebSocketPolyfill: WebSocket, params: { token: cfg.tokens[index] }, maxBackoffTime: 300, disableBc: true
  })
  return { index, doc, provider, text: doc.getText('content'), count: 0, offline: false }
}

function edit (c) {
  const current = c.text.toString()
  const lines = [...current.matchAll(markerPattern)]
  if (lines.length > 3 && Math.random() < 0.3) {
    const line = pick(lines)
    c.text.delete(line.index, line[0].length)
    deleted.add(line[0].slice(1))
    return
  }
  // Insert a whole marker line at a line boundary, so no marker is ever split.
  const boundaries = [current.length]
  for (let i = 0; i < current.length; i++) if (current[i] === '\n') boundaries.push(i)
  const marker = `⟦c${c.index}n${c.count++}${pick(flavours)}⟧`
  inserted.push(marker)
  c.text.insert(pick(boundaries), `\n${marker}`)
}

async function run (c, until) {
  while (Date.now() < until) {
    await sleep(20 + Math.random() * 80)
    if (!c.offline && Math.random() < 0.03) {
      c.offline = true
      c.provider.disconnect()
      setTimeout(() => { c.provider.connect(); c.offline = false }, 100 + Math.random() * 700)
    }
    edit(c)
  }
}

async function main () {
  const clients = Array.from({ length: cfg.clients }, (_, i) => makeClient(i))
  const deadline = Date.now() + 15000
  while (!clients.every((c) => c.provider.synced)) {
    if (Date.now() > deadline) throw new Error('clients did not sync at start')
    await sleep(20)
  }
  const until = Date.now() + cfg.seconds * 1000
  await Promise.all(clients.map((c) => run(c, until)))
  await sleep(1000)
  for (const c of clients) if (!c.provider.shouldConnect) c.provider.connect()
  const settle = Date.now() + 30000
  let texts = []
  while (Date.now() < settle) {
    texts = clients.map((c) => c.text.toString())
    if (clients.every((c) => c.provider.synced) && texts.every((t) => t === texts[0])) break
    await sleep(100)
  }
  const converged = texts.every((t) => t === texts[0])
  process.stdout.write(JSON.stringify({ converged, texts: converged ? [texts[0]] : texts, inserted, deleted: [...deleted] }) + '\n')
  for (const c of clients) c.provider.destroy()
  process.exit(0)
}

main().catch((err) => { console.error(err); process.exit(1) })
