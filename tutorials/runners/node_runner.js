'use strict';
// Codeyard's lesson test runner for JavaScript; runs inside the sandbox, Node's standard library only.
//
//     node .codeyard-check/node_runner.js .codeyard-check/spec.json
//
// It reads the spec (test files and input/output checks, in grading order), deletes its folder before any learner code
// runs, loads each node:test-style test file (CommonJS) from memory with a small stand-in for
// `node:test` (test, it, describe), runs the tests one by one with a timeout and captured output,
// then the input/output checks, and prints one JSON line after the spec's marker.

const fs = require('node:fs');
const path = require('node:path');
const util = require('node:util');
const vm = require('node:vm');
const Module = require('node:module');
const childProcess = require('node:child_process');

const WORKSPACE = process.cwd();
const TEXT_LIMIT = 2000;
const TIMEOUT = Symbol('timeout');

const specPath = path.resolve(process.argv[2]);
const spec = JSON.parse(fs.readFileSync(specPath, 'utf8'));
fs.rmSync(path.dirname(specPath), { recursive: true, force: true }); // gone before any learner code runs
const sources = Object.fromEntries(spec.checks.filter((c) => c.kind === 'file').map((c) => [c.file, c.source]));

// --- output capture -------------------------------------------------------------------------------

let captured = null;
for (const stream of [process.stdout, process.stderr]) {
  const write = stream.write.bind(stream);
  stream.write = (chunk, ...rest) => {
    if (captured === null) return write(chunk, ...rest);
    captured.push(String(chunk));
    const callback = rest.find((r) => typeof r === 'function');
    if (callback) callback();
    return true;
  };
}

const exit = process.exit.bind(process);
process.exit = (code) => { // a learner's process.exit() fails its test instead of ending the check
  const error = new Error(`process.exit(${code === undefined ? '' : code}) was called`);
  error.name = 'ProcessExit';
  throw error;
};

function report(result) {
  fs.writeSync(1, `\n${spec.marker} ${JSON.stringify(result)}\n`);
}

// --- a stand-in for node:test -------------------------------------------------------------------------

let registered = [];
const suites = [];

function register(name, options, fn) {
  if (typeof options === 'function') fn = options;
  const names = [...suites, String(name)];
  const task = names.map((n) => /^task\s+(\d+)\b/i.exec(n)).find(Boolean);
  registered.push({ name: names.join(' > '), fn, task: task ? Number(task[1]) : null });
}

function describe(name, options, fn) {
  if (typeof options === 'function') fn = options;
  suites.push(String(name));
  try {
    fn();
  } finally {
    suites.pop();
  }
}

const harness = Object.assign(register, { test: register, it: register, describe, suite: describe });
const originalLoad = Module._load;
Module._load = function load(request, ...rest) {
  if (request === 'node:test') return harness;
  return originalLoad.call(this, request, ...rest);
};

// --- locating errors -----------------------------------------------------------------------------------

function learnerFile(file) {
  if (!file || !file.startsWith(WORKSPACE + path.sep)) return null;
  const relative = path.relative(WORKSPACE, file);
  return relative in sources || !fs.existsSync(file) ? null : relative;
}

function sourceLine(relative, line) {
  const text = relative in sources ? sources[relative] : fs.readFileSync(path.join(WORKSPACE, relative), 'utf8');
  return text.split('\n')[line - 1];
}

function errorInfo(error) {
  const info = {
    type: error && error.name ? error.name : 'Error',
    message: error && error.message !== undefined ? String(error.message) : String(error),
    in_learner_file: false,
  };
  const stack = error && typeof error.stack === 'string' ? error.stack : '';
  const places = [];
  const header = /^(\/[^\s:]+):(\d+)$/m.exec(stack); // a SyntaxError names the file and line first
  if (header) places.push({ file: header[1], line: Number(header[2]), column: null });
  for (const match of stack.matchAll(/\(?(\/[^\s():]+):(\d+):(\d+)\)?$/gm)) {
    places.push({ file: match[1], line: Number(match[2]), column: Number(match[3]) });
  }
  const learner = places.find((p) => learnerFile(p.file));
  const inTests = places.find((p) => path.relative(WORKSPACE, p.file) in sources);
  const place = learner || inTests;
  if (place) {
    const relative = path.relative(WORKSPACE, place.file);
    Object.assign(info, {
      file: relative, line: place.line, column: place.column, code: sourceLine(relative, place.line), in_learner_file: Boolean(learner),
    });
  }
  return info;
}

const OPERATORS = {
  strictEqual: ['==', 'to be'], deepStrictEqual: ['==', 'to be'], equal: ['==', 'to be'], deepEqual: ['==', 'to be'], '==': ['==', 'to be'],
  notStrictEqual: ['!=', 'not to be'], notDeepStrictEqual: ['!=', 'not to be'], notEqual: ['!=', 'not to be'], match: ['match', 'to match'],
};

function firstArgument(line) {
  const start = line ? line.indexOf('(', line.search(/assert/)) : -1;
  if (start < 0) return null;
  let depth = 0;
  let quote = null;
  for (let i = start + 1; i < line.length; i += 1) {
    const c = line[i];
    if (quote) { if (c === quote && line[i - 1] !== '\\') quote = null; continue; }
    if (c === '"' || c === "'" || c === '`') quote = c;
    else if ('([{'.includes(c)) depth += 1;
    else if (')]}'.includes(c)) { if (depth === 0) return line.slice(start + 1, i).trim(); depth -= 1; }
    else if (c === ',' && depth === 0) return line.slice(start + 1, i).trim();
  }
  return null;
}

function failure(error) {
  const inspect = (v) => util.inspect(v, { depth: 4, breakLength: Infinity }).slice(0, 300);
  const where = errorInfo(error);
  const operator = OPERATORS[error.operator];
  const note = error.generatedMessage ? null : error.message;
  if (operator) {
    return {
      kind: 'compare', op: operator[0], op_words: operator[1], expression: firstArgument(where.code),
      expected: inspect(error.expected), actual: inspect(error.actual), note,
    };
  }
  return { kind: 'truth', expression: where.code ? where.code.trim() : null, note: error.message };
}

// --- running ---------------------------------------------------------------------------------------------

function withinTimeout(fn) {
  // a vm script's timeout also stops endless synchronous loops in whatever it calls (V8 terminates it)
  globalThis.__codeyardCall = fn;
  try {
    return vm.runInThisContext('__codeyardCall()', { timeout: spec.timeout * 1000 });
  } catch (error) {
    throw error && error.code === 'ERR_SCRIPT_EXECUTION_TIMEOUT' ? TIMEOUT : error;
  }
}

async function runTest(test, file, hidden) {
  const result = { name: test.name, file, hidden, task: test.task || spec.single_task, status: 'pass', test_code: String(test.fn) };
  captured = [];
  let timer;
  try {
    const returned = withinTimeout(() => test.fn({ name: test.name }));
    await Promise.race([returned, new Promise((resolve, reject) => { timer = setTimeout(() => reject(TIMEOUT), spec.timeout * 1000); })]);
  } catch (error) {
    if (error === TIMEOUT) Object.assign(result, { status: 'error', kind: 'timeout' });
    else if (error && error.code === 'ERR_ASSERTION') Object.assign(result, { status: 'fail' }, failure(error));
    else Object.assign(result, { status: 'error', kind: 'error', error: errorInfo(error) });
  } finally {
    clearTimeout(timer);
    result.output = captured.join('').slice(0, TEXT_LIMIT);
    captured = null;
  }
  return result;
}

function normalise(text) {
  return text.replace(/\r\n/g, '\n').trimEnd().split('\n').map((line) => line.trimEnd()).join('\n');
}

function runIo(check) {
  const result = {
    name: check.name, hidden: check.hidden, task: check.task || spec.single_task, status: 'pass', kind: 'io',
    stdin: check.stdin, stdout_regex: check.stdout_regex,
  };
  const proc = childProcess.spawnSync(process.execPath, [`./${spec.entry}`], {
    input: check.stdin, cwd: WORKSPACE, encoding: 'utf8', timeout: spec.timeout * 1000, killSignal: 'SIGKILL', maxBuffer: 1 << 20,
  });
  result.output = (proc.stdout || '').slice(0, TEXT_LIMIT);
  if (proc.error && proc.error.code === 'ETIMEDOUT') return { ...result, status: 'error', kind: 'timeout' };
  if (proc.status !== 0) return { ...result, status: 'error', kind: 'error', stderr: (proc.stderr || '').slice(-TEXT_LIMIT) };
  const passed = check.stdout_regex !== null
    ? new RegExp(check.stdout_regex, 'm').test(proc.stdout)
    : normalise(proc.stdout) === normalise(check.stdout);
  if (!passed) {
    const expected = check.stdout_regex !== null ? check.stdout_regex : check.stdout.trimEnd();
    Object.assign(result, { status: 'fail', expected, actual: proc.stdout.trimEnd().slice(0, TEXT_LIMIT) });
  }
  return result;
}

function load(test) {
  const filename = path.join(WORKSPACE, test.file);
  const module = new Module(filename, null);
  module.filename = filename;
  module.paths = Module._nodeModulePaths(path.dirname(filename));
  captured = [];
  try {
    withinTimeout(() => module._compile(test.source, filename));
    return null;
  } catch (error) {
    if (error === TIMEOUT) return { type: 'Timeout', message: 'loading took too long', in_learner_file: false, test_file: test.file };
    return { ...errorInfo(error), test_file: test.file };
  } finally {
    captured = null;
  }
}

async function main() {
  const results = [];
  for (const check of spec.checks) {
    if (check.kind === 'io') {
      results.push(runIo(check));
      continue;
    }
    registered = [];
    const error = load(check);
    if (error) {
      report({ load_error: error, load_error_hidden: check.hidden });
      return;
    }
    for (const registeredTest of registered) results.push(await runTest(registeredTest, check.file, check.hidden));
  }
  report({ tests: results });
}

main().then(() => exit(0));
