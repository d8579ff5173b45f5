// The live view: reads {state-url} every {poll-ms} and draws it. No framework, no network
// beyond this server; every string from the server goes in as text, never as HTML.
"use strict";

const body = document.body;
const POLL_MS = Number(body.dataset.pollMs);
const STATE_URL = body.dataset.stateUrl;

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  for (const c of children) node.append(c instanceof Node ? c : String(c));
  return node;
}

function setText(id, text, value) {
  const node = document.getElementById(id);
  node.textContent = text;
  if (value !== undefined) node.dataset.value = String(value);
}

function fillRows(tableId, rows) {
  const tbody = document.querySelector(`#${tableId} tbody`);
  tbody.replaceChildren(...rows.map((cells) => el("tr", {}, ...cells.map((c) =>
    c instanceof Node && c.tagName === "TD" ? c : el("td", {}, c)))));
}

function progress(r) {
  const total = r.prompt_tokens + r.max_tokens;
  const bar = el("div", { class: "bar", title: `${r.output_tokens} of ${r.max_tokens}` },
    el("div", { class: "fill", style: `width:${(100 * (r.prompt_tokens + r.output_tokens)) / total}%` }),
    el("div", { class: "fill prompt", style: `width:${(100 * r.prompt_tokens) / total}%` }));
  return el("td", { class: "progress", "data-output": r.output_tokens },
    bar, ` ${r.prompt_tokens} · ${r.output_tokens} / ${r.max_tokens}`);
}

function drawBlocks(blocks) {
  const box = document.getElementById("blocks");
  if (box.childElementCount !== blocks.length) {
    box.replaceChildren(...Array.from(blocks, () => el("span", { class: "blk f" })));
  }
  const counts = { a: 0, s: 0, c: 0, f: 0 };
  Array.from(blocks).forEach((ch, i) => {
    counts[ch] += 1;
    const node = box.children[i];
    if (node.className !== `blk ${ch}`) node.className = `blk ${ch}`;
  });
  box.dataset.counts = JSON.stringify(counts);
  return counts;
}

function draw(s) {
  setText("model", s.model);
  setText("policy", s.policy);
  setText("running", s.running, s.running);
  setText("waiting", s.waiting, s.waiting);
  setText("kv-usage", `${(100 * s.kv_usage).toFixed(1)} %`, s.kv_usage);
  setText("step-ms", s.rates.steps ? `${(1000 * s.rates.mean_step_s).toFixed(1)} ms` : "idle",
    s.rates.mean_step_s);
  setText("tokens-per-s", s.rates.tokens_per_s.toFixed(0), s.rates.tokens_per_s);
  setText("output-per-s", s.rates.output_tokens_per_s.toFixed(0), s.rates.output_tokens_per_s);
  setText("preemptions", s.preemptions, s.preemptions);
  const rate = s.prefix_cache_queries ? s.prefix_cache_hits / s.prefix_cache_queries : 0;
  setText("prefix-hits", `${(100 * rate).toFixed(0)} %`, rate);

  const n = drawBlocks(s.blocks);
  setText("block-summary", `${s.blocks.length} blocks of ${s.block_size} tokens: ` +
    `${n.a + n.s} running (${n.s} shared), ${n.c} cached prefix, ${n.f} free`);

  fillRows("running-set", s.running_set.map((r) => [
    r.index ? `${r.request_id}/${r.index}` : r.request_id, r.tenant, r.slo_class, progress(r),
    r.computed_tokens, `${r.age_s.toFixed(1)} s`]));
  fillRows("queues", s.queues.map((q) => [q.slo_class, q.tenant, q.waiting]));
  fillRows("tenants", s.tenants.map((t) => [t.tenant, t.slo_class, t.virtual_tokens.toFixed(0),
    `${(100 * t.share).toFixed(1)} %`, t.waiting, t.running]));
  fillRows("decisions", s.decisions.slice(0, 20).map((d) => [
    `${Math.max(0, s.now - d.at).toFixed(1)} s`, d.request_id, d.tenant, d.slo_class,
    el("td", { class: `decision-${d.decision}` }, d.decision), el("td", { class: "reason" }, d.reason)]));
  setText("status", `· updated ${new Date().toLocaleTimeString()}`);
  body.dataset.updates = String(Number(body.dataset.updates || 0) + 1);
}

async function poll() {
  try {
    const response = await fetch(STATE_URL, { credentials: "same-origin", cache: "no-store" });
    if (response.status === 401) { window.location.reload(); return; }
    if (response.ok) draw(await response.json());
    else setText("status", `· the server answered ${response.status}`);
  } catch (err) {
    setText("status", `· cannot reach the server (${err})`);
  } finally {
    setTimeout(poll, POLL_MS);
  }
}

poll();
