// The parts shared by the report (`runner report --html`) and the viewer (`runner view`):
// helpers, the tables of a run's groups, and an episode's events, as logged, made into a page section.
const RT = (() => {
'use strict';
function h(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  setA(e, attrs);
  for (const c of kids.flat(9)) if (c != null && c !== false) e.append(c instanceof Node ? c : String(c));
  return e;
}
function setA(e, attrs) {
  if (attrs) for (const k in attrs) {
    const v = attrs[k];
    if (v == null || v === false) continue;
    if (k === 'class') e.setAttribute('class', v);
    else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v === true ? '' : v);
  }
}
const SVG = 'http://www.w3.org/2000/svg';
function s(tag, attrs, ...kids) {
  const e = document.createElementNS(SVG, tag);
  setA(e, attrs);
  for (const c of kids) if (c != null) e.append(c instanceof Node ? c : String(c));
  return e;
}
const NF = new Intl.NumberFormat('en-US');
const int = v => v == null ? '-' : NF.format(v);
const p1 = v => (v * 100).toFixed(1);
const pct = v => v == null ? '-' : p1(v) + '%';
const rate = x => x.pass_rate == null ? '-' : pct(x.pass_rate) + (x.ci_low != null && x.ci_high != null ? ` [${p1(x.ci_low)}, ${p1(x.ci_high)}]` : '');
const cost = v => v == null ? '-' : '$' + (v >= 100 ? v.toFixed(0) : v >= 1 ? v.toFixed(2) : v.toFixed(4));
const ms = v => v == null ? '-' : v >= 60000 ? (v / 60000).toFixed(1) + ' min' : v >= 1000 ? (v / 1000).toFixed(2) + ' s' : v >= 10 ? v.toFixed(0) + ' ms' : v >= 0.01 ? v.toFixed(2) + ' ms' : v === 0 ? '0 ms' : '<0.01 ms';
const num = (v, d = 2) => v == null ? '-' : (+v).toFixed(d);
const J = v => { try { return JSON.stringify(v, null, 2); } catch (e) { return String(v); } };
const MAXTXT = 40000;
function pre(text, cls) {
  text = text == null ? '' : String(text);
  if (text.length <= MAXTXT) return h('pre', {class: cls}, text);
  const p = h('pre', {class: cls}, text.slice(0, MAXTXT));
  const b = h('button', {onclick: () => { p.textContent = text; b.remove(); }}, `show all ${int(text.length)} characters`);
  return h('div', null, p, b);
}
// A value readably: strings as text, objects as JSON, objects holding multi-line strings key by key.
function val(v, cls) {
  if (typeof v === 'string') return pre(v, cls);
  if (v && typeof v === 'object' && !Array.isArray(v) && Object.values(v).some(x => typeof x === 'string' && x.includes('\n')))
    return h('div', {class: cls}, Object.entries(v).map(([k, x]) => [h('div', {class: 'lbl'}, k), typeof x === 'string' ? pre(x) : pre(J(x))]));
  return pre(J(v), cls);
}
function args(a) {
  if (typeof a === 'string') { try { a = JSON.parse(a); } catch (e) { return pre(a, 'tool-args'); } }
  return pre(J(a), 'tool-args');
}
function lazy(label, fn, cls) {
  const d = h('details', {class: cls}, h('summary', null, label));
  d.addEventListener('toggle', () => { if (d.open && !d.dataset.done) { d.dataset.done = '1'; d.append(fn()); } });
  return d;
}
const kv = pairs => h('div', {class: 'kv'}, pairs.filter(p => p && p[1] != null && p[1] !== '').map(([k, v]) => h('span', null, k + ' ', h('b', null, v))));
const OUTCOMES = ['passed', 'failed', 'unscored', 'cancelled'];
const badge = o => h('span', {class: 'badge outcome-' + o}, o);

function content(c) {
  if (typeof c === 'string') return pre(c);
  if (Array.isArray(c)) return c.map(b => b && b.type === 'text' && typeof b.text === 'string' ? pre(b.text)
    : b && b.type === 'tool_use' ? toolCall(b.name, b.input, b.id)
    : b && b.type === 'tool_result' ? [h('div', {class: 'lbl'}, 'tool result ' + (b.tool_use_id || '') + (b.is_error ? ' (error)' : '')), content(b.content)]
    : val(b));
  return c == null ? null : val(c);
}
function toolCall(name, a, id) {
  return h('div', {class: 'tool-call', 'data-tool-name': name}, h('div', null, h('span', {class: 'tool-name'}, name), id ? h('span', {class: 'muted'}, ' ' + id) : null), args(a));
}
function messages(req) {
  const out = [];
  if (req.system != null) out.push(h('div', {class: 'msg', 'data-role': 'system'}, h('div', {class: 'role'}, 'system'), content(req.system)));
  for (const m of req.messages) {
    if (!m || typeof m !== 'object') { out.push(val(m)); continue; }
    out.push(h('div', {class: 'msg', 'data-role': m.role}, h('div', {class: 'role'}, (m.role || '?') + (m.tool_call_id ? ' · ' + m.tool_call_id : '')),
      content(m.content), (m.tool_calls || []).map(c => c.function ? toolCall(c.function.name, c.function.arguments, c.id) : val(c))));
  }
  return out;
}
function grader(g) {
  if (!g || typeof g !== 'object') return g == null ? null : h('div', {class: 'grader'}, val(g));
  const u = g.usage || {};
  const known = ['model', 'samples', 'agreement', 'usage', 'cost_usd', 'template_digest', 'raw_outputs'];
  const box = h('div', {class: 'grader'}, h('div', {class: 'lbl'}, 'LLM grader'),
    kv([['model', g.model], ['samples', g.samples], ['agreement', g.agreement == null ? null : pct(g.agreement)],
      g.usage && ['tokens', `${int(u.input_tokens)} in / ${int(u.output_tokens)} out`], ['cost', g.cost_usd === undefined ? null : cost(g.cost_usd)], ['template', g.template_digest && String(g.template_digest).slice(0, 12)]]));
  const outs = g.raw_outputs;
  if (Array.isArray(outs)) outs.forEach((o, i) => box.append(h('div', {class: 'lbl'}, `Grader output ${i + 1} of ${outs.length}`), val(o, 'grader-output')));
  else if (outs != null) box.append(h('div', {class: 'lbl'}, 'Grader output'), val(outs, 'grader-output'));
  for (const k of Object.keys(g)) if (!known.includes(k)) {
    const v = g[k];
    box.append(h('div', {class: 'lbl'}, k.replace(/_/g, ' ')), Array.isArray(v) && v.every(x => typeof x === 'string') ? v.map(x => pre(x, 'grader-output')) : val(v, 'grader-output'));
  }
  return box;
}
// What the terminal prints under its summary (episodes not run, unscored causes with their
// first message, a cost that is a lower bound, …), one line each.
const runNotes = notes => h('ul', {class: 'run-notes', id: 'run-notes', 'aria-label': 'What the run says'}, notes.map(n => h('li', null, n)));
// A table of groups (totals, models, suites × models) as the terminal's summary has them.
function statsTable(id, rows, withSuite) {
  const cols = [
    withSuite && ['Suite', x => x.suite],
    ['Model', x => x.model],
    ['Episodes', x => int(x.episodes), 1], ['Scored', x => int(x.scored), 1], ['Passed', x => int(x.passed), 1],
    ['Failed', x => int(x.failed), 1], ['Unscored', x => int(x.unscored), 1], ['Cancelled', x => int(x.cancelled), 1],
    ['Pass rate [95% CI]', rate, 1], ['Coverage', x => `${int(x.scored)}/${int(x.episodes)}`, 1], ['Mean score', x => num(x.mean_score, 3), 1], ['Tokens', x => int(x.tokens), 1],
    ['Cost', x => cost(x.cost_usd), 1], ['Latency p50', x => ms(x.latency_p50_ms), 1], ['Latency p95', x => ms(x.latency_p95_ms), 1],
    ['Mean steps', x => num(x.mean_steps, 1), 1]].filter(Boolean);
  return h('div', {class: 'tw'}, h('table', {id},
    h('thead', null, h('tr', null, cols.map(c => h('th', {class: c[2] ? 'r' : null}, c[0])))),
    h('tbody', null, rows.map(x => h('tr', {'data-model': x.model, 'data-suite': x.suite}, cols.map(c => h('td', {class: c[2] ? 'r' : null}, c[1](x))))))));
}
// The observations of a turn in the order of its calls, not in the order they finished (a
// quick error logged before the results of calls made earlier in the same turn): each turn's
// observations are put back in their places, sorted by when their call was dispatched.
function inCallOrder(evs) {
  const order = new Map();
  evs.forEach(v => { if (v.type === 'action_dispatched' && v.call && v.call.call_id != null && !order.has(v.call.call_id)) order.set(v.call.call_id, order.size); });
  const turns = new Map();
  evs.forEach((v, i) => {
    const id = v.type === 'observation' && v.observation ? v.observation.call_id : null;
    if (id == null || !order.has(id)) return;
    const key = (v.actor || 'main') + ' ' + v.step;
    if (!turns.has(key)) turns.set(key, []);
    turns.get(key).push(i);
  });
  const out = evs.slice();
  for (const places of turns.values()) {
    const sorted = places.map(i => evs[i]).sort((a, b) => order.get(a.observation.call_id) - order.get(b.observation.call_id));
    places.forEach((at, k) => { out[at] = sorted[k]; });
  }
  return out;
}
// The tree of agents of an episode (subagents: main → main.1 → main.1.1), each with its
// model calls and tool calls, and the goal and answer of its delegation.
function agentTree(evs) {
  const agents = new Map();
  const agent = name => {
    if (!agents.has(name)) agents.set(name, {name, turns: 0, calls: [], goal: null, answer: null, error: null});
    return agents.get(name);
  };
  agent('main');
  for (const v of evs) {
    if (v.type === 'model_call' && !v.scorer) agent(v.actor || 'main').turns++;
    else if (v.type === 'action_dispatched' && v.call) agent(v.call.actor || 'main').calls.push(v.call.name);
    else if (v.type === 'agent_action' && v.name === 'delegate_task') {
      const r = v.result && typeof v.result === 'object' ? v.result : null;
      if (r && r.actor) Object.assign(agent(r.actor), {goal: v.arguments && v.arguments.goal, answer: r.answer});
    }
  }
  if (agents.size < 2) return null;
  const names = [...agents.keys()].filter(n => n === 'main' || /^main(\.[1-9][0-9]*)+$/.test(n));
  const parentOf = n => n.slice(0, n.lastIndexOf('.'));
  const node = name => {
    const a = agents.get(name);
    const kids = names.filter(n => n !== 'main' && parentOf(n) === name)
      .sort((x, y) => x.localeCompare(y, undefined, {numeric: true}));
    const calls = a.calls.length ? a.calls.join(', ') : 'no tool calls';
    return h('li', {class: 'agent-node', 'data-actor': name},
      h('span', {class: 'mono agent-name'}, name), h('span', {class: 'muted'}, ` · ${a.turns} model ${a.turns === 1 ? 'call' : 'calls'} · ${calls}`),
      a.goal != null ? h('div', {class: 'agent-goal'}, 'goal: ' + a.goal) : null,
      a.answer != null ? h('div', {class: 'agent-answer'}, 'answered: ' + a.answer) : null,
      kids.length ? h('ul', null, kids.map(node)) : null);
  };
  return h('div', {class: 'agent-tree', id: 'agent-tree'}, h('div', {class: 'lbl'}, 'Agents'), h('ul', null, node('main')));
}
// `scoringId`: the regrade whose scores are current (older ones are shown superseded).
function trajectory(t, evs, scoringId) {
  evs = inCallOrder(evs.slice().sort((a, b) => (a.seq ?? 0) - (b.seq ?? 0)));
  const tree = agentTree(evs);
  if (tree) t.append(tree);
  const who = a => a && a !== 'main' ? a : '';
  const current = scoringId && evs.some(v => v.type === 'score' && v.scoring_id === scoringId) ? scoringId : null;
  let shownInput = false;
  const ev = (type, title, sub, ...body) => h('div', {class: 'ev ev-' + type, 'data-seq': title && title.seq}, h('div', {class: 'ev-h'}, title.text, sub ? h('span', {class: 'muted'}, sub) : null), body);
  const one = v => {
    const step = v.step != null ? 'step ' + v.step : '';
    const T = text => ({text, seq: v.seq});
    switch (v.type) {
      case 'episode_started':
        t.append(ev('started', T('Episode started'), [v.suite, v.task_id, v.model, v.variant && 'variant ' + v.variant, 'epoch ' + v.epoch, v.environment && 'env ' + v.environment].filter(Boolean).join(' · ')));
        break;
      case 'observation': {
        const o = v.observation || {};
        if (o.call_id == null && !o.error && o.tool_result == null) {
          t.append(ev('input', T('Task input'), step, (o.messages || []).map(m => pre(m, 'task-message')), o.info && Object.keys(o.info).length ? lazy('environment info', () => pre(J(o.info))) : null));
          break;
        }
        const err = o.error;
        const x = ev('observation', T(err ? 'Observation · tool error' : 'Observation'), [step, o.call_id, o.done ? 'done' : ''].filter(Boolean).join(' · '),
          err ? h('div', {class: 'errbox tool-error'}, h('span', {class: 'error-type'}, err.type || 'error'), h('span', {class: 'error-message'}, err.message || ''),
            err.suggested_action ? h('div', {class: 'muted'}, 'suggested: ' + err.suggested_action) : null, err.retryable ? h('div', {class: 'muted'}, 'retryable') : null) : null,
          o.tool_result != null ? val(o.tool_result, 'tool-result') : null,
          (o.messages || []).map(m => pre(m)), o.info && Object.keys(o.info).length ? lazy('info', () => pre(J(o.info))) : null);
        x.dataset.callId = o.call_id || '';
        if (err) x.classList.add('obs-error');
        t.append(x);
        break;
      }
      case 'model_call': {
        const req = v.request, r = v.response;
        if (!shownInput && req && Array.isArray(req.messages)) {
          shownInput = true;
          t.append(ev('input', T('Input messages'), `as sent to ${v.model}`, h('div', {class: 'messages'}, messages(req))));
        }
        const u = v.usage || {};
        const x = ev('model-call', T('Model response'), [step, who(v.actor), v.model].filter(Boolean).join(' · '),
          kv([['tokens', `${int(u.input_tokens)} in / ${int(u.output_tokens)} out` + (u.cached_tokens ? ` (${int(u.cached_tokens)} cached)` : '')],
            ['latency', ms(v.latency_ms)], ['attempts', v.attempts], ['cache hit', v.cache_hit ? 'yes' : null], ['cost', v.cost_usd == null ? null : cost(v.cost_usd)],
            ['finish', r && r.finish_reason]]),
          v.error || v.cause ? h('div', {class: 'errbox call-error'}, h('span', {class: 'error-type'}, v.cause || 'error'), h('span', {class: 'error-message'}, v.error || '')) : null,
          r && r.text ? pre(r.text, 'response-text') : null,
          r && Array.isArray(r.tool_calls) ? r.tool_calls.map(c => toolCall(c.name, c.arguments, c.id)) : null,
          r && typeof r !== 'object' ? val(r) : null,
          req ? lazy(`request body${Array.isArray(req.messages) ? ` (${req.messages.length} messages)` : ''}`, () => pre(J(req))) : null,
          v.raw_response != null ? lazy('raw response', () => pre(J(v.raw_response))) : null);
        t.append(x);
        break;
      }
      case 'action_dispatched': {
        const c = v.call || {};
        const x = ev('action', T('Tool call ' + (c.name || '')), [step, who(c.actor), c.call_id].filter(Boolean).join(' · '), args(c.arguments));
        x.dataset.toolName = c.name || ''; x.dataset.callId = c.call_id || ''; x.dataset.actor = c.actor || 'main';
        t.append(x);
        break;
      }
      case 'agent_action': {
        const err = v.error;
        const x = ev('agent-action', T('Agent action ' + (v.name || '') + ' (' + (v.class || 'cognitive') + ')'), [step, who(v.actor), v.call_id].filter(Boolean).join(' · '),
          args(v.arguments), err ? h('div', {class: 'errbox tool-error'}, h('span', {class: 'error-type'}, err.type || 'error'), h('span', {class: 'error-message'}, err.message || ''))
            : val(v.result, 'tool-result'));
        x.dataset.toolName = v.name || ''; x.dataset.actor = v.actor || 'main';
        t.append(x);
        break;
      }
      case 'error':
        t.append(ev('error', T('Error'), step, h('div', {class: 'errbox'}, h('span', {class: 'error-type'}, v.cause || 'error'), h('span', {class: 'error-message'}, v.message || ''))));
        break;
      case 'final':
        t.append(ev('final', T('Final answer'), step, pre(v.answer, 'final-answer')));
        break;
      case 'agent_error':
        t.append(ev('error', T('Agent error'), step, h('div', {class: 'errbox'}, h('span', {class: 'error-type'}, 'agent_error'), h('span', {class: 'error-message'}, v.message || ''))));
        break;
      case 'agent_program':
        t.append(ev('other', T('Agent program'), [`pid ${v.pid}`, v.exit, v.kept ? 'kept for another episode' : ''].filter(Boolean).join(' · '),
          v.stderr_tail ? lazy('stderr (tail)', () => pre(v.stderr_tail)) : null));
        break;
      case 'score': {
        const old = current && v.scoring_id !== current;
        const x = ev('score', T(''), null);
        x.querySelector('.ev-h').append(h('span', {class: 'badge ' + (v.passed ? 'b-pass' : 'b-fail')}, v.passed ? 'pass' : 'fail'), 'Score · ' + v.scorer,
          h('span', {class: 'muted'}, `value ${num(v.value, 3)} · weight ${v.weight ?? 1} · scoring ${v.scoring_id || 'initial'}` + (old ? ' (superseded)' : '')));
        x.append(v.explanation ? h('div', {class: 'explanation'}, v.explanation) : null, grader(v.grader) || '',
          v.check != null ? lazy('what was checked', () => pre(J(v.check))) : '');
        x.dataset.scorer = v.scorer; x.dataset.passed = String(!!v.passed);
        if (!v.passed) x.classList.add('failed');
        if (old) x.classList.add('superseded');
        t.append(x);
        break;
      }
      case 'episode_finished': {
        const o = v.outcome || {}, u = v.usage || {};
        t.append(ev('finished', T('Episode finished'), [o.status, o.score != null ? 'score ' + num(o.score, 3) : '', o.passed != null ? (o.passed ? 'passed' : 'failed') : '', o.cause, v.termination].filter(Boolean).join(' · '),
          o.message ? h('div', {class: o.status === 'unscored' ? 'warnbox' : 'errbox'}, h('span', {class: 'error-type'}, o.cause || 'unscored'), o.message) : null,
          kv([['steps', v.steps], ['tool calls', v.tool_calls], ['tool errors', v.tool_errors], ['tokens', `${int(u.input_tokens)} in / ${int(u.output_tokens)} out`], ['cost', cost(v.cost_usd)], ['wall', ms(v.wall_ms)]])));
        break;
      }
      case 'episode_scored': {
        const o = v.outcome || {};
        t.append(ev('rescored', T('Re-scored'), [v.scoring_id, o.status, o.score != null ? 'score ' + num(o.score, 3) : '', o.passed != null ? (o.passed ? 'passed' : 'failed') : '', o.cause].filter(Boolean).join(' · '), o.message ? pre(o.message) : null));
        break;
      }
      default:
        t.append(ev('other', T(String(v.type)), step, lazy('event', () => pre(J(v)))));
    }
  };
  // A long trajectory is drawn a slice at a time, so the page keeps answering while it grows.
  const CHUNK = 400;
  let at = 0;
  const more = () => {
    for (const end = Math.min(at + CHUNK, evs.length); at < end; at++) one(evs[at]);
    if (at < evs.length) { t.dataset.drawing = 'true'; setTimeout(more, 0); } else delete t.dataset.drawing;
  };
  more();
}

return {h, setA, s, NF, int, p1, pct, rate, cost, ms, num, J, pre, val, args, lazy, kv, OUTCOMES, badge, statsTable, runNotes, trajectory};
})();
