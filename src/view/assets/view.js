// The viewer's page: the runs, a run's episodes, an episode, a comparison and two episodes
// aligned, each at its own address (#/…), every number asked of the server's API.
(() => {
'use strict';
const {h, int, pct, rate, cost, ms, num, kv, badge, statsTable, runNotes, trajectory} = RT;
const app = document.getElementById('app');
const crumbs = document.getElementById('crumbs');
const raterInput = document.getElementById('rater');
const enc = encodeURIComponent;
const PAGE = 100;
let live = null;

async function api(path, options) {
  const r = await fetch(path, options);
  const body = await r.json().catch(() => ({error: r.statusText}));
  if (!r.ok) throw new Error(body.error || r.statusText);
  return body;
}
function parse() {
  const [path, qs] = location.hash.replace(/^#/, '').split('?');
  return {parts: (path || '/').split('/').filter(Boolean).map(decodeURIComponent), q: new URLSearchParams(qs || '')};
}
const href = (parts, q) => '#/' + parts.map(enc).join('/') + (q && String(q) ? '?' + q : '');
// The address of the current page with `q`, without a new page load.
function setQuery(q) {
  const {parts} = parse();
  history.replaceState(null, '', href(parts, q));
}
function setCrumbs(...items) {
  crumbs.replaceChildren(...items.map(([text, to]) => h('span', {class: 'crumb'}, to ? h('a', {href: to}, text) : text)));
}
function user(name) {
  if (!raterInput.value) raterInput.value = localStorage.getItem('runner.rater') || name || '';
}
raterInput.addEventListener('change', () => localStorage.setItem('runner.rater', raterInput.value.trim()));
// Every warning of a run, at the top, as the terminal says it.
function warnings(list, prefix) {
  return (list || []).map(w => h('div', {class: 'banner run-warning', role: 'alert'}, h('b', null, 'Warning. '), prefix ? prefix + ': ' : '', w));
}
function table(id, cols, rows, rowAttrs) {
  return h('div', {class: 'tw'}, h('table', {id},
    h('thead', null, h('tr', null, cols.map(c => h('th', {class: c[2] ? 'r' : null, scope: 'col'}, c[0])))),
    h('tbody', null, rows.map((x, i) => h('tr', rowAttrs ? rowAttrs(x, i) : null, cols.map(c => h('td', {class: c[2] ? 'r' : null}, c[1](x, i))))))));
}
// The page's content: nested lists flattened, nothing shown for null.
const show = (...kids) => app.replaceChildren(...kids.flat(9).filter(k => k != null && k !== false));
const navRow = to => ({class: 'nav-row', tabindex: 0, 'data-href': to});
app.addEventListener('click', ev => {
  const tr = ev.target.closest('tr.nav-row');
  if (tr && !ev.target.closest('a,button,input,select,label')) location.hash = tr.dataset.href;
});
// Keyboard: j/k or arrows move between rows, Enter opens, Escape goes back.
document.addEventListener('keydown', ev => {
  if (ev.target.closest && ev.target.closest('input,select,textarea')) return;
  const rows = [...app.querySelectorAll('tr.nav-row')];
  const at = rows.indexOf(document.activeElement);
  if (ev.key === 'j' || ev.key === 'ArrowDown') { if (rows.length) { rows[Math.min(at + 1, rows.length - 1)].focus(); ev.preventDefault(); } }
  else if (ev.key === 'k' || ev.key === 'ArrowUp') { if (rows.length) { rows[Math.max(at - 1, 0)].focus(); ev.preventDefault(); } }
  else if (ev.key === 'Enter' && at >= 0) location.hash = rows[at].dataset.href;
  else if (ev.key === 'Escape') history.back();
});

async function route() {
  if (live) { live.close(); live = null; }
  const {parts, q} = parse();
  try {
    if (!parts.length) await runsPage();
    else if (parts[0] === 'run' && parts.length === 2) await runPage(parts[1], q);
    else if (parts[0] === 'run' && parts[2] === 'episode' && parts.length === 4) await episodePage(parts[1], parts[3]);
    else if (parts[0] === 'compare' && parts[1] === 'task') await alignPage(q);
    else if (parts[0] === 'compare') await comparePage(q);
    else show(h('p', null, 'No such page. ', h('a', {href: '#/'}, 'The runs')));
  } catch (e) {
    show(h('div', {class: 'banner', role: 'alert', id: 'error'}, h('b', null, 'Error. '), e.message));
  }
  document.body.dataset.ready = location.hash;
}
window.addEventListener('hashchange', route);

// The runs, newest first.
async function runsPage() {
  setCrumbs();
  const data = await api('/api/runs');
  user(data.user);
  document.title = 'runner view · runs';
  const chosen = [];
  const compare = h('button', {id: 'compare-selected', disabled: true, onclick: () => { location.hash = href(['compare'], new URLSearchParams({runs: chosen.join(',')})); }}, 'Compare selected');
  const pick = (key, box) => {
    const at = chosen.indexOf(key);
    if (box.checked && at < 0) chosen.push(key); else if (!box.checked && at >= 0) chosen.splice(at, 1);
    compare.disabled = chosen.length < 2;
    compare.textContent = chosen.length >= 2 ? `Compare ${chosen.length} runs (baseline ${chosen[0]})` : 'Compare selected';
  };
  const t = x => x.totals || {};
  const cols = [
    ['Run', x => h('a', {href: href(['run', x.key]), class: 'mono'}, x.key)],
    ['', x => x.error ? '' : h('input', {type: 'checkbox', class: 'pick', 'aria-label': 'Compare ' + x.key, 'data-key': x.key, onchange: ev => pick(x.key, ev.target)})],
    ['Started', x => x.started || '-'],
    ['Status', x => x.error ? h('span', {class: 'badge outcome-failed'}, 'unreadable') : h('span', {class: 'badge ' + (x.status === 'finished' ? 'b-neutral' : 'outcome-unscored')}, x.status)],
    ['Models', x => (x.models || []).join(', ')],
    ['Suites', x => (x.suites || []).join(', ')],
    ['Episodes', x => int(t(x).episodes) + (x.planned && x.planned !== t(x).episodes ? ` of ${int(x.planned)}` : ''), 1],
    ['Pass rate [95% CI]', x => x.error ? x.error : rate(t(x)), 1],
    ['Coverage', x => `${int(t(x).scored)}/${int(t(x).episodes)}`, 1],
    ['Cost', x => cost(t(x).cost_usd), 1],
    ['Warnings', x => x.warnings ? h('span', {class: 'badge outcome-unscored'}, x.warnings) : '', 1]];
  show(h('h1', null, 'Runs'),
    h('p', {class: 'note'}, 'Newest first. Pick two runs or more to compare them; the first picked is the baseline.'),
    h('div', {class: 'filters'}, compare),
    table('runs-table', cols, data.runs, x => Object.assign(navRow(href(['run', x.key])), {'data-key': x.key})));
}

// A run: its warnings, tables and episodes, filtered and paged by the server.
async function runPage(key, q) {
  const head = await api(`/api/runs/${enc(key)}`);
  user(head.user);
  document.title = 'runner view · ' + head.run_id;
  setCrumbs([head.run_id, null]);
  const f = head.facets || {};
  const sel = (name, label, values, all) => h('label', null, label, h('select', {id: 'filter-' + name, name},
    h('option', {value: ''}, all), Object.keys(values || {}).map(v => h('option', {value: v, selected: q.get(name) === v}, `${v} (${int(values[v])})`))));
  const statuses = Object.assign({scored: (f.status && ((f.status.passed || 0) + (f.status.failed || 0))) || 0}, f.status || {});
  const filters = h('form', {class: 'filters', id: 'filters', onsubmit: ev => ev.preventDefault()},
    sel('status', 'Outcome', statuses, 'All outcomes'), sel('cause', 'Unscored cause', f.cause, 'Any cause'),
    sel('suite', 'Suite', f.suite, 'All suites'), sel('model', 'Model', f.model, 'All models'),
    f.variant ? sel('variant', 'Variant', f.variant, 'All variants') : null,
    f.tag ? sel('tag', 'Tag', f.tag, 'Any tag') : null,
    h('label', null, 'Metadata', h('input', {type: 'search', id: 'filter-meta', name: 'meta', value: q.get('meta') || '', placeholder: 'key=value'})),
    h('label', null, 'Search', h('input', {type: 'search', id: 'filter-q', name: 'q', value: q.get('q') || '', placeholder: 'task or episode id'})),
    h('label', null, 'Labelled', h('input', {type: 'checkbox', id: 'filter-labelled', name: 'labelled', checked: q.get('labelled') === '1'})));
  const tbody = h('tbody', {id: 'episode-rows'});
  const count = h('span', {id: 'episode-count', class: 'muted', 'aria-live': 'polite'});
  const prev = h('button', {id: 'prev-page'}, '‹ Prev'), next = h('button', {id: 'next-page'}, 'Next ›');
  const COLS = [['Episode', e => e.episode_id], ['Suite', e => e.suite], ['Task', e => e.task_id],
    ['Model', e => e.variant ? `${e.model} [${e.variant}]` : e.model], ['Epoch', e => e.epoch, 1],
    ['Outcome', e => [badge(e.outcome), e.unscored_cause ? h('span', {class: 'cause'}, e.unscored_cause) : null]],
    ['Score', e => num(e.score, 3), 1], ['Steps', e => int(e.steps), 1], ['Tools', e => int(e.tool_calls), 1],
    ['Tool err', e => int(e.tool_errors), 1], ['Tokens', e => int(e.tokens), 1], ['Cost', e => cost(e.cost_usd), 1],
    ['Wall', e => ms(e.wall_ms), 1], ['Labelled', e => e.labelled ? 'yes' : '']];
  let offset = +(q.get('offset') || 0), asking = 0;
  async function rows() {
    const mine = ++asking;
    const fq = new URLSearchParams();
    for (const el of filters.elements) {
      if (el.type === 'checkbox') { if (el.checked) fq.set(el.name, '1'); } else if (el.value) fq.set(el.name, el.value);
    }
    if (offset) fq.set('offset', offset);
    setQuery(fq);
    const asked = String(fq);
    fq.set('limit', PAGE);
    const page = await api(`/api/runs/${enc(key)}/episodes?${fq}`);
    if (mine !== asking) return; // a later filter's answer is the one to show
    tbody.replaceChildren(...page.rows.map(e => h('tr', Object.assign(navRow(href(['run', key, 'episode', e.episode_id])), {'data-episode-id': e.episode_id, 'data-outcome': e.outcome}),
      COLS.map(c => h('td', {class: c[2] ? 'r' : c[0] === 'Episode' ? 'id' : null}, c[1](e))))));
    if (!page.rows.length) tbody.append(h('tr', null, h('td', {colspan: COLS.length, class: 'muted'}, 'No episode matches the filters.')));
    count.textContent = page.matched ? `rows ${int(offset + 1)}–${int(offset + page.rows.length)} of ${int(page.matched)}` + (page.matched !== page.total ? ` (filtered from ${int(page.total)})` : '') : `0 of ${int(page.total)}`;
    count.dataset.matched = page.matched;
    count.dataset.query = asked;
    prev.disabled = offset === 0;
    next.disabled = offset + PAGE >= page.matched;
  }
  let timer;
  filters.addEventListener('input', () => { clearTimeout(timer); timer = setTimeout(() => { offset = 0; rows(); }, 150); });
  prev.onclick = () => { offset = Math.max(0, offset - PAGE); rows(); };
  next.onclick = () => { offset += PAGE; rows(); };
  const shq = a => /^[\w@%+=:,./-]+$/.test(a) ? a : "'" + a.replace(/'/g, "'\\''") + "'";
  show(
    h('header', {id: 'run-header'}, h('h1', null, 'Run ', h('span', {id: 'run-id', class: 'mono'}, head.run_id)),
      h('dl', {class: 'meta'}, h('dt', null, 'Folder'), h('dd', {class: 'mono'}, head.dir),
        h('dt', null, 'Command line'), h('dd', null, h('code', null, (head.command_line || []).map(shq).join(' '))),
        head.scoring_id ? [h('dt', null, 'Scoring'), h('dd', {class: 'mono'}, head.scoring_id)] : null),
      warnings(head.warnings),
      (head.notes || []).length ? runNotes(head.notes) : null,
      head.interrupted && head.finished ? h('div', {class: 'banner', role: 'alert'}, h('b', null, 'Interrupted. '), 'The run was stopped before it finished.') : null),
    head.finished ? null : livePanel(key, head, rows),
    h('section', null, h('h2', null, 'Models'), statsTable('models-table', head.models || [], false)),
    h('section', null, h('h2', null, 'Suites × models'), statsTable('suites-table', head.suites || [], true)),
    h('section', {id: 'episodes'}, h('h2', null, 'Episodes'), filters,
      h('div', {class: 'tw'}, h('table', {id: 'episode-table'}, h('thead', null, h('tr', null, COLS.map(c => h('th', {class: c[2] ? 'r' : null, scope: 'col'}, c[0])))), tbody)),
      h('div', {class: 'pager'}, prev, count, next)));
  await rows();
}

// A run being written: episodes appear as they finish, a progress bar, the running episodes' steps.
function livePanel(key, head, reload) {
  let finished = head.episodes;
  const running = new Map((head.running || []).map(id => [id, 0]));
  const bar = h('progress', {id: 'live-progress', max: Math.max(head.planned, 1), value: finished});
  const text = h('span', {id: 'live-count'});
  const list = h('div', {id: 'running'});
  const panel = h('section', {id: 'live', 'aria-live': 'polite'}, h('b', null, 'Live. '), bar, ' ', text, list);
  const update = () => {
    bar.value = finished;
    text.textContent = `${int(finished)} of ${int(head.planned)} episodes finished`;
    list.textContent = running.size ? 'running: ' + [...running].map(([id, steps]) => `${id} (step ${steps})`).join(', ') : '';
  };
  update();
  let timer;
  live = new EventSource(`/api/runs/${enc(key)}/live?from=${head.log_bytes}`);
  live.addEventListener('started', ev => { running.set(JSON.parse(ev.data).episode_id, 0); update(); });
  live.addEventListener('step', ev => { const d = JSON.parse(ev.data); running.set(d.episode_id, d.step); update(); });
  live.addEventListener('finished', ev => {
    running.delete(JSON.parse(ev.data).episode_id); finished++; update();
    clearTimeout(timer); timer = setTimeout(reload, 250);
  });
  live.addEventListener('run_finished', () => {
    live.close(); live = null;
    panel.replaceChildren(h('b', null, 'Finished. '), `${int(finished)} episodes.`);
    panel.id = 'live-finished';
    reload();
  });
  return panel;
}

// An episode: its result, the labels people gave it and its judges' verdicts, its trajectory.
async function episodePage(key, id) {
  const data = await api(`/api/runs/${enc(key)}/episodes/${enc(id)}`);
  document.title = 'runner view · ' + id;
  setCrumbs([data.run_id, href(['run', key])], [id, null]);
  const e = data.episode;
  const info = e ? kv([['suite', e.suite], ['task', e.task_id], ['model', e.model], ['epoch', e.epoch], ['score', num(e.score, 3)],
    e.unscored_cause && ['unscored cause', e.unscored_cause], ['steps', e.steps], ['tool calls', e.tool_calls], ['tool errors', e.tool_errors],
    ['tokens', int(e.tokens)], ['cost', cost(e.cost_usd)], ['wall', ms(e.wall_ms)], ['termination', e.termination]]) : h('p', {class: 'muted'}, 'This episode has not finished.');
  const scores = data.events.filter(v => v.type === 'score');
  const current = data.scoring_id && scores.some(v => v.scoring_id === data.scoring_id) ? data.scoring_id : null;
  const graded = scores.filter(v => v.grader && (!current || v.scoring_id === current));
  const labels = h('section', {class: 'labels', id: 'labels'}, h('h2', null, 'Labels'),
    labelForm(key, id, null, 'The episode', e ? `outcome: ${e.outcome}` : '', data.labels),
    graded.map(v => labelForm(key, id, v.scorer, 'Judge · ' + v.scorer, `judge: ${v.passed ? 'pass' : 'fail'} (${num(v.value, 3)}) · ${v.explanation || ''}`, data.labels)));
  const t = h('div', {id: 'trajectory', 'data-episode-id': id});
  trajectory(t, data.events, data.scoring_id);
  show(h('h1', null, 'Episode ', h('span', {class: 'mono'}, id), ' ', e ? badge(e.outcome) : null),
    warnings(data.warnings), info, labels, h('h2', null, 'Trajectory'), t);
}

// A verdict, a score and a comment on the episode (scorer null) or on one judge's verdict.
function labelForm(key, id, scorer, title, judge, all) {
  const name = scorer || 'episode';
  const mine = (all || []).filter(l => (l.scorer || 'episode') === name);
  const list = h('ul', {class: 'label-list'}, mine.map(item));
  const score = h('input', {type: 'number', min: 0, max: 1, step: 0.05, 'aria-label': `Score for ${name} (0 to 1)`, class: 'label-score'});
  const comment = h('input', {type: 'text', 'aria-label': `Comment on ${name}`, placeholder: 'comment', class: 'label-comment'});
  const status = h('span', {class: 'muted label-status', 'aria-live': 'polite'});
  async function save(verdict) {
    const rater = raterInput.value.trim();
    if (!rater) { status.textContent = 'Say who you are (top right) to save labels.'; raterInput.focus(); return; }
    const body = {episode_id: id, verdict, rater};
    if (scorer) body.scorer = scorer;
    if (score.value !== '') body.score = +score.value;
    if (comment.value.trim()) body.comment = comment.value.trim();
    try {
      const saved = await api(`/api/runs/${enc(key)}/labels`, {method: 'POST', headers: {'Content-Type': 'application/json'}, body: JSON.stringify(body)});
      list.append(item(saved));
      status.textContent = `saved: ${verdict}`;
    } catch (err) { status.textContent = 'not saved: ' + err.message; }
  }
  return h('div', {class: 'label-form', 'data-scorer': name},
    h('b', null, title), h('span', {class: 'judge'}, judge),
    h('button', {class: 'label-pass', onclick: () => save('pass')}, 'Pass'),
    h('button', {class: 'label-fail', onclick: () => save('fail')}, 'Fail'),
    score, comment, status, list);
}
const item = l => h('li', {class: 'label'}, `${l.rater}: ${l.verdict}` + (l.score != null ? ` (${l.score})` : '') + (l.explanation ? ` · ${l.explanation}` : '') + ` · ${l.ts || ''}`);

// Runs compared: the paired tests of `runner compare`, and the tasks with each run's outcomes.
async function comparePage(q) {
  const runs = (q.get('runs') || '').split(',').filter(Boolean);
  const fq = new URLSearchParams({runs: runs.join(',')});
  for (const k of ['only', 'cause', 'suite', 'tag', 'meta', 'variant', 'offset']) if (q.get(k)) fq.set(k, q.get(k));
  const data = await api(`/api/compare?${fq}`);
  document.title = 'runner view · compare';
  setCrumbs(['compare ' + runs.join(' vs '), null]);
  const groups = data.groups;
  const baseline = h('p', {id: 'baseline'}, 'Baseline: ', h('b', {class: 'mono'}, runs[0]), ' (pinned in the address). ',
    runs.slice(1).map(k => h('button', {class: 'make-baseline', onclick: () => {
      const order = [k, ...runs.filter(r => r !== k)];
      const nq = new URLSearchParams(fq); nq.set('runs', order.join(',')); location.hash = href(['compare'], nq);
    }}, `Make ${k} the baseline`)));
  const pairCols = [['A', p => p.a], ['B', p => p.b], ['Tasks', p => int(p.shared), 1], ['A only', p => int(p.only_a), 1], ['B only', p => int(p.only_b), 1],
    ['Pass rate A', p => pct(p.pass_rate_a), 1], ['Pass rate B', p => pct(p.pass_rate_b), 1],
    ['Effect (B−A)', p => p.effect == null ? '-' : (p.effect >= 0 ? '+' : '') + (p.effect * 100).toFixed(1) + ' pts', 1],
    ['McNemar p', p => h('span', {'data-field': 'mcnemar_p', 'data-value': p.mcnemar_p}, fmtP(p.mcnemar_p)), 1],
    ['Score diff (B−A)', p => h('span', {'data-field': 'score_diff', 'data-value': p.score_diff ?? ''}, p.score_diff == null ? '-' : sgn(p.score_diff)), 1],
    ['95% CI (paired bootstrap)', p => h('span', {'data-field': 'score_diff_ci', 'data-low': p.score_diff_low ?? '', 'data-high': p.score_diff_high ?? ''},
      p.score_diff_low == null ? `n=${p.shared} <10` : `[${sgn(p.score_diff_low)}, ${sgn(p.score_diff_high)}]`), 1],
    ['Bootstrap p', p => h('span', {'data-field': 'bootstrap_p', 'data-value': p.bootstrap_p ?? ''}, p.bootstrap_p == null ? '-' : fmtP(p.bootstrap_p)), 1]];
  const flips = data.pairs.map(p => ['regressed', 'improved'].map(kind => {
    const list = p.flips.filter(f => f.regressed === (kind === 'regressed'));
    return list.length ? h('p', {class: 'flips', 'data-kind': kind, 'data-a': p.a, 'data-b': p.b},
      `${p.b} vs ${p.a}: ${list.length} ${kind === 'regressed' ? 'passed in A, failed in B' : 'failed in A, passed in B'}: `,
      list.map((f, i) => [i ? ', ' : '', h('span', {class: 'mono flip', 'data-task': `${f.suite}/${f.task_id}`}, `${f.suite}/${f.task_id}`)])) : null;
  }));
  const causes = [...new Set(data.rows.flatMap(r => r.cells.flatMap(c => c.causes)))];
  const filter = (name, label, options) => h('label', null, label, h('select', {id: 'compare-' + name, onchange: ev => {
    const nq = new URLSearchParams(fq); nq.delete('offset');
    if (ev.target.value) nq.set(name, ev.target.value); else nq.delete(name);
    location.hash = href(['compare'], nq);
  }}, options.map(([v, t]) => h('option', {value: v, selected: (q.get(name) || '') === v}, t))));
  const suites = [...new Set(data.rows.map(r => r.suite))];
  const filters = h('div', {class: 'filters'},
    filter('only', 'Show', [['', 'All tasks'], ['flips', 'Only flips'], ['failures', 'Only failures'], ['unscored', 'Only unscored']]),
    filter('cause', 'Unscored cause', [['', 'Any cause'], ...causes.map(c => [c, c])]),
    filter('suite', 'Suite', [['', 'All suites'], ...(q.get('suite') && !suites.includes(q.get('suite')) ? [q.get('suite')] : []).concat(suites).map(s => [s, s])]),
    (data.tags || []).length ? filter('tag', 'Tag', [['', 'Any tag'], ...data.tags.map(t => [t, t])]) : null,
    (data.variants || []).length ? filter('variant', 'Variant', [['', 'Any variant'], ...data.variants.map(v => [v, v])]) : null,
    h('label', null, 'Metadata', h('input', {type: 'search', id: 'compare-meta', value: q.get('meta') || '', placeholder: 'key=value', onchange: ev => {
      const nq = new URLSearchParams(fq); nq.delete('offset');
      if (ev.target.value.trim()) nq.set('meta', ev.target.value.trim()); else nq.delete('meta');
      location.hash = href(['compare'], nq);
    }})),
    h('span', {id: 'task-count', class: 'muted', 'data-matched': data.matched},
      data.rows.length < data.matched ? `tasks ${int(data.offset + 1)}–${int(data.offset + data.rows.length)} of ${int(data.matched)} (of ${int(data.tasks)})` : `${int(data.matched)} of ${int(data.tasks)} tasks`));
  const turn = by => {
    const nq = new URLSearchParams(fq); nq.set('offset', Math.max(0, data.offset + by)); location.hash = href(['compare'], nq);
  };
  const pager = h('div', {class: 'pager'},
    h('button', {id: 'tasks-prev', disabled: data.offset === 0, onclick: () => turn(-200)}, '‹ Prev'),
    h('button', {id: 'tasks-next', disabled: data.offset + data.rows.length >= data.matched, onclick: () => turn(200)}, 'Next ›'));
  const cell = c => {
    if (!c.episodes.length) return h('span', {class: 'muted'}, '—');
    const cls = c.unscored && !c.scored ? 'cell-unscored' : c.passed * 2 > c.scored ? 'cell-pass' : 'cell-fail';
    return h('span', {class: cls}, c.scored ? `${c.passed}/${c.scored} passed` : '', c.unscored ? ` ${c.unscored} unscored (${[...new Set(c.causes)].join(', ')})` : '');
  };
  const change = ch => ch ? h('span', {class: 'change ' + (ch === 'pass→fail' ? 'change-regressed' : ch === 'fail→pass' ? 'change-improved' : 'change-unscored')}, ch) : '';
  const taskCols = [['Task', r => `${r.suite}/${r.task_id}`],
    ...groups.map((g, i) => [g.model + (i === 0 ? ' (baseline)' : ''), r => [cell(r.cells[i]), ' ', change(r.change[i])]])];
  const taskHref = r => href(['compare', 'task'], new URLSearchParams({runs: runs.join(','), suite: r.suite, task: r.task_id}));
  show(h('h1', null, 'Compare'),
    data.runs.map(r => warnings(r.warnings, r.run_id)), baseline,
    h('section', null, h('h2', null, 'Groups'), statsTable('groups-table', groups, false)),
    h('section', null, h('h2', null, 'Paired tests'), table('pairs-table', pairCols, data.pairs, p => ({'data-a': p.a, 'data-b': p.b})),
      h('p', {class: 'note'}, 'Per task (its epochs by majority): exact McNemar on pass/fail, a paired bootstrap of the mean score difference (shown from 10 shared tasks) — the numbers `runner compare` prints.'), flips),
    h('section', null, h('h2', null, 'Tasks'), filters,
      table('tasks-table', taskCols, data.rows, r => Object.assign(navRow(taskHref(r)), {'data-task': `${r.suite}/${r.task_id}`, 'data-change': r.change.filter(Boolean).join(' ')})), pager));
}
const sgn = v => (v >= 0 ? '+' : '') + v.toFixed(3);
const fmtP = p => p < 0.0001 ? '<0.0001' : p.toFixed(4);

// One task's episodes side by side, the baseline's and another group's, turn by turn.
async function alignPage(q) {
  const runs = (q.get('runs') || '').split(',').filter(Boolean);
  const fq = new URLSearchParams({runs: runs.join(','), suite: q.get('suite') || '', task: q.get('task') || ''});
  const data = await api(`/api/compare?${fq}`);
  const row = data.rows[0];
  const back = href(['compare'], new URLSearchParams({runs: runs.join(',')}));
  setCrumbs(['compare', back], [`${q.get('suite')}/${q.get('task')}`, null]);
  if (!row) { show(h('p', null, 'No such task in these runs.')); return; }
  const other = Math.min(+(q.get('group') || 1), data.groups.length - 1);
  const epochs = [...new Set(row.cells.flatMap(c => c.episodes.map(e => e.epoch)))].sort((a, b) => a - b);
  const epoch = q.has('epoch') ? +q.get('epoch') : epochs[0];
  const pick = (i) => row.cells[i].episodes.find(e => e.epoch === epoch) || row.cells[i].episodes[0];
  const a = pick(0), b = other > 0 ? pick(other) : null;
  const go = (k, v) => { const nq = new URLSearchParams(q); nq.set(k, v); location.hash = href(['compare', 'task'], nq); };
  const controls = h('div', {class: 'filters'},
    h('label', null, 'Against', h('select', {id: 'align-group', onchange: ev => go('group', ev.target.value)},
      data.groups.map((g, i) => i ? h('option', {value: i, selected: i === other}, g.model) : null))),
    h('label', null, 'Epoch', h('select', {id: 'align-epoch', onchange: ev => go('epoch', ev.target.value)}, epochs.map(e => h('option', {value: e, selected: e === epoch}, e)))));
  show(h('h1', null, 'Task ', h('span', {class: 'mono'}, `${row.suite}/${row.task_id}`)), data.runs.map(r => warnings(r.warnings, r.run_id)), controls);
  if (!a || !b) { app.append(h('p', null, 'One side has no episode of this task.')); return; }
  const keyOf = i => data.runs[data.group_runs[i]].key;
  const al = await api(`/api/align?${new URLSearchParams({a: keyOf(0), ea: a.episode_id, b: keyOf(other), eb: b.episode_id})}`);
  const turn = t => t ? [t.calls.map(c => h('div', {class: 'call' + (c.error ? ' error' : '')}, `${c.name}(${JSON.stringify(c.arguments)})` + (c.error ? ' → error' : ''))),
    t.answer != null ? h('div', {class: 'call answer'}, 'final: ' + t.answer) : null] : h('span', {class: 'muted'}, '(no turn)');
  const side = (s, g) => h('th', {scope: 'col'}, `${data.groups[g].model} · `, h('a', {href: href(['run', s.key, 'episode', s.episode_id])}, s.episode_id), ' ', s.episode ? badge(s.episode.outcome) : '');
  const first = al.first_divergence;
  app.append(h('p', {id: 'divergence-note'}, first == null ? 'The two episodes made the same calls and gave the same answer.' : `They first differ at turn ${first + 1}.`),
    h('div', {class: 'tw'}, h('table', {class: 'aligned', id: 'aligned'},
      h('thead', null, h('tr', null, h('th', {scope: 'col'}, 'Turn'), side(al.a, 0), side(al.b, other))),
      h('tbody', null, al.rows.map((r, i) => h('tr', {class: (r.same ? 'same' : 'diverged') + (i === first ? ' first-divergence' : ''), id: i === first ? 'first-divergence' : null, 'data-turn': i + 1},
        h('td', null, String(i + 1), i === first ? h('div', {class: 'divergence-mark'}, 'first divergence') : null), h('td', null, turn(r.a)), h('td', null, turn(r.b))))))));
}

route();
})();
