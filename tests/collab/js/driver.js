// Drives named Yjs clients (stock y-websocket WebsocketProvider) from JSON lines on stdin.
// Each command line gets one JSON reply line on stdout. Used by tests/collab/collab_clients.py.
const readline = require('readline')
const Y = require('yjs')
const { WebsocketProvider } = require('y-websocket')
const WebSocket = require('ws')

const serverUrl = process.argv[2]
const clients = new Map()

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))

async function waitFor (check, timeoutMs, describe) {
  const deadline = Date.now() + timeoutMs
  while (Date.now() < deadline) {
    if (check()) return
    await sleep(20)
  }
  throw new Error(`timed out waiting for ${describe()}`)
}

function client (name) {
  const c = clients.get(name)
  if (!c) throw new Error(`no client ${name}`)
  return c
}

function awarenessStates (c) {
  const states = {}
  c.provider.awareness.getStates().forEach((state, id) => {
    if (id !== c.doc.clientID) states[id] = state
  })
  return states
}

const commands = {
  async open ({ name, project, file, token, headers, user, timeout = 10000 }) {
    // token: the test harness's query parameter; headers: the real app's session cookie.
    const Socket = headers ? class extends WebSocket { constructor (url, protocols) { super(url, protocols, { headers }) } } : WebSocket
    const doc = new Y.Doc()
    const provider = new WebsocketProvider(`${serverUrl}/ws/collab/${project}`, file, doc, {
      WebSocketPolyfill: Socket, params: token ? { token } : {}, maxBackoffTime: 300, disableBc: true
    })
    const c = { doc, provider, text: doc.getText('content'), closeCodes: [], synced: false }
    provider.on('connection-close', (event) => { c.closeCodes.push(event.code) })
    provider.on('sync', (synced) => { c.synced = c.synced || synced })
    if (user) provider.awareness.setLocalStateField('user', { name: user })
    clients.set(name, c)
    await waitFor(() => c.synced || c.closeCodes.length > 0, timeout, () => `${name} to sync`)
    return { synced: c.synced, closeCodes: c.closeCodes, text: c.text.toString() }
  },
  async insert ({ name, index, text }) {
    client(name).text.insert(index, text)
    return {}
  },
  async delete ({ name, index, length }) {
    client(name).text.delete(index, length)
    return {}
  },
  async text ({ name }) {
    return { text: client(name).text.toString() }
  },
  async wait_text ({ name, text, timeout = 10000 }) {
    const c = client(name)
    await waitFor(() => c.text.toString() === text, timeout, () => `${name} text ${JSON.stringify(text)}, has ${JSON.stringify(c.text.toString())}`)
    return {}
  },
  async wait_users ({ name, users, timeout = 10000 }) {
    const c = client(name)
    const seen = () => Object.values(awarenessStates(c)).map((s) => s.user && s.user.name).filter(Boolean).sort()
    await waitFor(() => JSON.stringify(seen()) === JSON.stringify([...users].sort()), timeout,
      () => `${name} to see users ${JSON.stringify(users)}, sees ${JSON.stringify(seen())}`)
    return {}
  },
  async set_cursor ({ name, index }) {
    const c = client(name)
    const anchor = Y.createRelativePositionFromTypeIndex(c.text, index)
    c.provider.awareness.setLocalStateField('cursor', { anchor: Y.relativePositionToJSON(anchor) })
    return {}
  },
  async cursor_of ({ name, user }) {
    // The absolute index (UTF-16) of another user's cursor, resolved in this client's document.
    const c = client(name)
    for (const state of Object.values(awarenessStates(c))) {
      if (state.user && state.user.name === user && state.cursor) {
        const pos = Y.createAbsolutePositionFromRelativePosition(Y.createRelativePositionFromJSON(state.cursor.anchor), c.doc)
        return { index: pos ? pos.index : null }
      }
    }
    return { index: null }
  },
  async status ({ name }) {
    const c = client(name)
    return { connected: c.provider.wsconnected, closeCodes: c.closeCodes }
  },
  async wait_closed ({ name, timeout = 10000 }) {
    const c = client(name)
    await waitFor(() => c.closeCodes.length > 0, timeout, () => `${name} to be closed`)
    return { closeCodes: c.closeCodes }
  },
  async disconnect ({ name }) {
    client(name).provider.disconnect()
    return {}
  },
  async connect ({ name, timeout = 10000 }) {
    const c = client(name)
    c.synced = false
    c.provider.connect()
    await waitFor(() => c.provider.synced, timeout, () => `${name} to resync`)
    return { text: c.text.toString() }
  },
  async close ({ name }) {
    const c = client(name)
    c.provider.destroy()
    c.doc.destroy()
    clients.delete(name)
    return {}
  }
}

const lines = readline.createInterface({ input: process.stdin })
let queue = Promise.resolve()
lines.on('line', (line) => {
  queue = queue.then(async () => {
    const cmd = JSON.parse(line)
    let reply
    try {
      reply = { ok: true, ...(await commands[cmd.op](cmd)) }
    } catch (err) {
      reply = { ok: false, error: String(err && err.message ? err.message : err) }
    }
    process.stdout.write(JSON.stringify(reply) + '\n')
  })
})
lines.on('close', () => {
  queue.then(() => {
    for (const c of clients.values()) c.provider.destroy()
    process.exit(0)
  })
})
