// tidemq web console: one page, routed by the URL's hash, reading the listener's /api/.
// Every value from the cluster is put in the page as text (textContent), never as HTML:
// topic names, keys and message values are user data.
"use strict";

const REFRESH_MS = 2000; // pages with rates read again this often
let refreshTimer = null;

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "onclick" || k === "onsubmit" || k === "onchange") node[k] = v;
    else if (v !== undefined && v !== null && v !== false) node.setAttribute(k, v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

function table(id, headers, rows) {
  return el("table", { id },
    el("thead", {}, el("tr", {}, headers.map((h) => el("th", {}, h)))),
    el("tbody", {}, rows.map((r) => el("tr", {}, r.map((c) =>
      typeof c === "number" ? el("td", { class: "num" }, c.toLocaleString("en")) : el("td", {}, c))))));
}

async function api(path, body) {
  const init = body === undefined ? {} : {
    method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
  };
  const response = await fetch("/api/" + path, init);
  const data = await response.json();
  if (!response.ok) throw new Error(data.error || response.statusText);
  return data;
}

function enc(part) { return encodeURIComponent(part); }
function bytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
}
function when(ms) { return ms ? new Date(ms).toISOString().replace(".000", "") : "-"; }
function duration(ms) {
  if (ms < 1000) return `${ms} ms`;
  const s = Math.round(ms / 1000);
  return s < 120 ? `${s} s` : s < 7200 ? `${Math.round(s / 60)} min` : `${Math.round(s / 3600)} h`;
}
function shown(v) {
  if (v === null || v === undefined) return "";
  if (v.decoded !== undefined) return JSON.stringify(v.decoded, null, 1);
  const body = v.text !== undefined ? v.text : `base64:${v.base64}`;
  return (v.decode_error ? `[${v.decode_error}] ` : "") + body + (v.truncated ? " …" : "");
}
function rate(prev, now, key, field) {
  // Per second, from two samples of a counter; "" until two samples exist.
  if (!prev || !prev[key]) return "";
  const dt = (now.t - prev[key].t) / 1000;
  return dt > 0 ? Math.max(0, (now[field] - prev[key][field]) / dt).toFixed(1) : "";
}

// ---------------------------------------------------------------- pages

const samples = {};

async function cluster(main) {
  const c = await api("cluster");
  const rows = c.brokers.map((b) => {
    const s = b.status;
    if (!s) return [b.name, b.address, b.last_heartbeat_ms_ago + " ms", b.topics,
      el("span", { class: "error" }, b.status_error), "", "", "", "", ""];
    const now = { t: c.now_ms, in: s.messages_in, out: s.messages_out };
    const row = [b.name, b.address, b.last_heartbeat_ms_ago + " ms", b.topics, s.version,
      duration(s.uptime_ms), s.connections, bytes(s.log_end_position),
      s.disk_total_bytes ? `${bytes(s.disk_free_bytes)} free of ${bytes(s.disk_total_bytes)}` : "-",
      `${rate(samples, now, b.name, "in") || "…"} in / ${rate(samples, now, b.name, "out") || "…"} out`];
    samples[b.name] = now;
    return row;
  });
  main.replaceChildren(
    el("h1", {}, "Cluster"),
    el("h2", {}, "Name servers"),
    el("ul", { id: "name-servers" }, c.name_servers.map((a) => el("li", {}, a))),
    el("h2", {}, `Brokers (${c.brokers.length})`),
    table("brokers", ["Name", "Address", "Heartbeat", "Topics", "Version", "Up", "Connections",
      "Log end", "Disk", "Messages/s"], rows));
}

async function topics(main, params) {
  // A page at a time (500 by name): a cluster may hold 100,000 topics.
  const all = params.get("system") === "1";
  const prefix = params.get("prefix") || "";
  const q = new URLSearchParams({ prefix, after: params.get("after") || "" });
  if (all) q.set("system", "1");
  const page = await api(`topics?${q}`);
  const link = (changes) => {
    const next = new URLSearchParams({ prefix, ...(all ? { system: "1" } : {}), ...changes });
    for (const [k, v] of [...next]) if (!v) next.delete(k);
    return `#/topics?${next}`;
  };
  const filter = el("form", { id: "topic-filter" },
    el("label", {}, "Name starts with", el("input", { name: "prefix", value: prefix })),
    el("button", { type: "submit" }, "Filter"));
  filter.onsubmit = (event) => {
    event.preventDefault();
    location.hash = link({ prefix: filter.prefix.value });
  };
  main.replaceChildren(
    el("h1", {}, "Topics"),
    filter,
    el("p", {}, el("a", { href: link({ system: all ? "" : "1" }) },
      all ? "Hide system topics" : "Show system topics")),
    table("topics", ["Name", "Queues", "Type", "Config"], page.topics.map((t) => [
      el("a", { href: `#/topic/${enc(t.name)}` }, t.name), t.queues, t.message_type,
      Object.entries(t.config).map(([k, v]) => `${k}=${v}`).join(", ")])),
    page.next ? el("p", {}, el("a", { id: "next-topics", href: link({ after: page.next }) },
      `Next page (after ${page.next})`)) : null);
}

async function topic(main, params, name) {
  const t = await api(`topics/${enc(name)}`);
  const total = t.queue_info.reduce((n, q) => n + q.max_offset - q.min_offset, 0);
  const now = { t: t.now_ms, end: t.queue_info.reduce((n, q) => n + q.max_offset, 0) };
  const inRate = rate(samples, now, "topic:" + name, "end");
  samples["topic:" + name] = now;
  main.replaceChildren(
    el("h1", {}, `Topic ${t.name}`),
    el("p", { id: "topic-summary" }, `${t.queues} queues, ${t.message_type}, ` +
      `${total.toLocaleString("en")} messages retained, ${inRate || "…"} messages/s in`),
    el("h2", {}, "Config"),
    table("topic-config", ["Key", "Value"], Object.entries(t.config)),
    el("h2", {}, "Queues"),
    table("queues", ["Queue", "First offset", "End offset", "Messages", "Broker", "Compacted to", ""],
      t.queue_info.map((q) => [q.queue, q.min_offset, q.max_offset, q.max_offset - q.min_offset,
        q.broker, q.compacted_end,
        el("a", { href: `#/messages?topic=${enc(name)}&queue=${q.queue}&offset=${q.min_offset}` },
          "browse")])),
    t.chains.length ? [el("h2", {}, "Static chains"),
      el("pre", { id: "chains" }, JSON.stringify(t.chains, null, 1))] : []);
}

async function groups(main) {
  const list = await api("groups");
  main.replaceChildren(el("h1", {}, "Consumer groups"),
    table("groups", ["Group"], list.map((g) => [el("a", { href: `#/group/${enc(g)}` }, g)])));
}

async function group(main, params, name) {
  const g = await api(`groups/${enc(name)}`);
  const topicsOf = [...new Set(g.offsets.map((o) => o.topic))];
  const plan = el("div", { id: "reset-plan" });
  const form = el("form", { id: "reset-form" },
    el("label", {}, "Topic", el("select", { name: "topic" },
      topicsOf.map((t) => el("option", { value: t }, t)))),
    el("label", {}, "To", el("select", { name: "to" },
      ["earliest", "latest", "timestamp", "offset", "shift"].map((t) => el("option", { value: t }, t)))),
    el("label", {}, "Value", el("input", { name: "value", type: "number", value: "0" })),
    el("button", { type: "submit", id: "reset-dry-run" }, "Dry run"));
  form.onsubmit = async (event) => {
    event.preventDefault();
    const body = { topic: form.topic.value, to: form.to.value, value: Number(form.value.value) };
    const show = (title, planned, extra) => plan.replaceChildren(el("h2", {}, title),
      table("reset-offsets", ["Topic", "Queue", "New offset"],
        planned.map((p) => [p.topic, p.queue, p.offset])), extra || []);
    try {
      const planned = await api(`reset/${enc(name)}`, { ...body, execute: false });
      const apply = el("button", { id: "reset-apply", type: "button" }, "Apply this reset");
      apply.onclick = async () => {
        try {
          show("Applied", await api(`reset/${enc(name)}`, { ...body, execute: true }),
            el("p", { class: "ok", id: "reset-done" }, "Offsets reset."));
        } catch (e) { plan.append(el("p", { class: "error" }, e.message)); }
      };
      show("Planned (dry run: nothing changed yet)", planned, apply);
    } catch (e) { plan.replaceChildren(el("p", { class: "error" }, e.message)); }
  };
  main.replaceChildren(
    el("h1", {}, `Group ${g.group}`),
    el("p", {}, `generation ${g.generation}, ${g.members.length} member(s)`),
    el("h2", {}, "Members"),
    table("members", ["Member", "Client", "Assigned queues"], g.members.map((m) =>
      [m.member_id, m.client_id, m.assignment.map(([t, q]) => `${t}:${q}`).join(", ")])),
    el("h2", {}, "Offsets and lag"),
    table("lag", ["Topic", "Queue", "Committed", "End", "Lag", "Lag in time"], g.offsets.map((o) =>
      [o.topic, o.queue, o.committed, o.max_offset, o.lag,
        o.lag_ms === undefined ? "" : duration(o.lag_ms)])),
    el("h2", {}, "Reset offsets"),
    el("p", { class: "note" }, "Refused while the group has members. A dry run shows the plan first."),
    form, plan);
}

function messageRows(list) {
  return table("messages", ["Queue", "Offset", "Id", "Stored", "Key", "Tag", "Keys", "Headers", "Value"],
    list.map((m) => [m.queue, m.offset, m.id, when(m.timestamp_ms), shown(m.key), m.tag || "",
      m.keys.join(", "), el("pre", {}, Object.entries(m.headers).map(([k, v]) => `${k}: ${shown(v)}`).join("\n")),
      el("pre", {}, (m.value.schema_id !== undefined ? `[schema ${m.value.schema_id}] ` : "") + shown(m.value))]));
}

async function messages(main, params) {
  const out = el("div", { id: "message-results" });
  const browse = el("form", { id: "browse-form" },
    el("label", {}, "Topic", el("input", { name: "topic", value: params.get("topic") || "", required: true })),
    el("label", {}, "Queue", el("input", { name: "queue", type: "number", value: params.get("queue") || "0" })),
    el("label", {}, "From offset", el("input", { name: "offset", type: "number", value: params.get("offset") || "0" })),
    el("label", {}, "Or from time (UTC)", el("input", { name: "at", type: "datetime-local", step: "1" })),
    el("label", {}, "Count", el("input", { name: "limit", type: "number", value: "20" })),
    el("button", { type: "submit", id: "browse" }, "Browse"));
  const byId = el("form", { id: "id-form" },
    el("label", {}, "Message id", el("input", { name: "id", size: 32 })),
    el("button", { type: "submit", id: "find-id" }, "Find"));
  const byKey = el("form", { id: "key-form" },
    el("label", {}, "Topic", el("input", { name: "topic", value: params.get("topic") || "" })),
    el("label", {}, "Key", el("input", { name: "key", size: 24 })),
    el("label", {}, "From (UTC)", el("input", { name: "from", type: "datetime-local", step: "1" })),
    el("label", {}, "To (UTC)", el("input", { name: "to", type: "datetime-local", step: "1" })),
    el("button", { type: "submit", id: "find-key" }, "Find"));
  const run = async (path) => {
    try {
      const got = await api(path);
      const list = Array.isArray(got) ? got : [got];
      out.replaceChildren(el("p", {}, `${list.length} message(s)`), messageRows(list));
    } catch (e) { out.replaceChildren(el("p", { class: "error" }, e.message)); }
  };
  browse.onsubmit = (event) => {
    event.preventDefault();
    const q = new URLSearchParams({ topic: browse.topic.value, queue: browse.queue.value,
      limit: browse.limit.value });
    if (browse.at.value) q.set("at_ms", String(Date.parse(browse.at.value + "Z")));
    else q.set("offset", browse.offset.value);
    run(`messages?${q}`);
  };
  byId.onsubmit = (event) => { event.preventDefault(); run(`message/${enc(byId.id.value.trim())}`); };
  byKey.onsubmit = (event) => {
    event.preventDefault();
    const q = new URLSearchParams({ topic: byKey.topic.value, key: byKey.key.value, limit: "50" });
    if (byKey.from.value) q.set("start_ms", String(Date.parse(byKey.from.value + "Z")));
    if (byKey.to.value) q.set("end_ms", String(Date.parse(byKey.to.value + "Z")));
    run(`messages-by-key?${q}`);
  };
  main.replaceChildren(el("h1", {}, "Messages"), el("h2", {}, "Browse a queue"), browse,
    el("h2", {}, "Look up by id"), byId, el("h2", {}, "Look up by key (newest first)"), byKey, out);
  if (params.get("topic")) browse.requestSubmit();
}

async function dlqGroups(main) {
  const list = await api("dlq");
  main.replaceChildren(el("h1", {}, "Dead letters"),
    list.length ? table("dlq-groups", ["Group"], list.map((g) => [el("a", { href: `#/dlq/${enc(g)}` }, g)]))
      : el("p", {}, "No group has dead letters."));
}

async function dlq(main, params, name) {
  const d = await api(`dlq/${enc(name)}`);
  const result = el("div", { id: "redrive-result" });
  const button = el("button", { id: "redrive" }, "Redrive all not yet redriven");
  button.onclick = async () => {
    try {
      const r = await api(`redrive/${enc(name)}`, {});
      result.replaceChildren(el("p", { class: "ok" }, `${r.redriven} message(s) sent back to their topics.`));
    } catch (e) { result.replaceChildren(el("p", { class: "error" }, e.message)); }
  };
  const header = (m, k) => m.headers[k] ? shown(m.headers[k]) : "";
  main.replaceChildren(el("h1", {}, `Dead letters of ${d.group}`),
    el("p", {}, `${d.letters.length} shown; offsets below ${d.redriven_below} were redriven.`),
    table("dead-letters", ["Offset", "From topic", "Queue", "Offset there", "Attempts", "Last error", "Value"],
      d.letters.map((m) => [m.offset, header(m, "tidemq.dlq.topic"), header(m, "tidemq.dlq.queue"),
        header(m, "tidemq.dlq.offset"), header(m, "tidemq.dlq.attempts"), header(m, "tidemq.dlq.error"),
        el("pre", {}, shown(m.value))])),
    button, result);
}

async function timers(main) {
  const t = await api("timers");
  const result = el("div", { id: "cancel-result" });
  const form = el("form", { id: "cancel-form" },
    el("label", {}, "Delayed message id", el("input", { name: "id", size: 32 })),
    el("button", { type: "submit", id: "cancel" }, "Cancel it"));
  form.onsubmit = async (event) => {
    event.preventDefault();
    try {
      const r = await api("timers/cancel", { message_id: form.id.value.trim() });
      result.replaceChildren(el("p", { class: "ok" }, `Cancelled ${r.count} message(s) for ${r.topic}, due ${when(r.deliver_at_ms)}.`));
    } catch (e) { result.replaceChildren(el("p", { class: "error" }, e.message)); }
  };
  main.replaceChildren(el("h1", {}, "Delayed messages"),
    el("p", {}, `precision ${t.precision_ms} ms, longest delay ${duration(t.max_delay_ms)}; ` +
      `delivered ${t.delivered_batches} batch(es), cancelled ${t.cancelled_batches} since start`),
    table("timers", ["Topic", "Pending batches", "Pending messages", "Next due"],
      t.topics.map((p) => [p.topic, p.pending_batches, p.pending_messages, when(p.next_due_ms)])),
    el("h2", {}, "Cancel a delayed message"), form, result);
}

async function transactions(main) {
  const t = await api("transactions");
  const result = el("div", { id: "rollback-result" });
  const rollback = (id) => {
    const b = el("button", { "data-txn": id }, "Roll back");
    b.onclick = async () => {
      try {
        await api("transactions/rollback", { txn_id: id });
        result.replaceChildren(el("p", { class: "ok" }, `Rolled back ${id}.`));
      } catch (e) { result.replaceChildren(el("p", { class: "error" }, e.message)); }
    };
    return b;
  };
  main.replaceChildren(el("h1", {}, "Transactions"),
    el("p", {}, `${t.committed} committed, ${t.rolled_back} rolled back since start; check-back after ` +
      `${duration(t.check_delay_ms)}, every ${duration(t.check_interval_ms)}, at most ${t.max_checks} times`),
    el("h2", {}, "Open"),
    table("open-transactions", ["Id", "Producer group", "Messages", "First send", "Checks", ""],
      t.open.map((o) => [o.txn_id, o.group, o.messages, when(o.first_send_ms), o.checks, rollback(o.txn_id)])),
    result,
    el("h2", {}, "Rolled back by the brokers"),
    table("discarded-transactions", ["Id", "Producer group", "Messages", "When", "Why"],
      t.discarded.map((d) => [d.txn_id, d.group, d.messages, when(d.decided_ms), d.reason])));
}

async function schemas(main) {
  const list = await api("schemas");
  main.replaceChildren(el("h1", {}, "Schemas"),
    table("schemas", ["Subject", "Compatibility", "Version", "Id", "Type", "Schema"],
      list.flatMap((s) => s.versions.map((v) => [s.subject, s.compatibility, v.version, v.id, v.type,
        el("pre", {}, v.schema)]))));
}

// ---------------------------------------------------------------- routing

const pages = [
  [/^cluster$/, cluster, true], [/^topics$/, topics], [/^topic\/(.+)$/, topic, true],
  [/^groups$/, groups], [/^group\/(.+)$/, group], [/^messages$/, messages],
  [/^dlq$/, dlqGroups], [/^dlq\/(.+)$/, dlq], [/^timers$/, timers],
  [/^transactions$/, transactions], [/^schemas$/, schemas],
];

async function route() {
  clearInterval(refreshTimer);
  const [path, query] = (location.hash.replace(/^#\/?/, "") || "cluster").split("?");
  const params = new URLSearchParams(query || "");
  const main = document.getElementById("main");
  for (const a of document.querySelectorAll("#nav a")) {
    a.classList.toggle("active", path.startsWith(a.getAttribute("href").slice(2).replace(/s$/, "")));
  }
  for (const [pattern, page, refresh] of pages) {
    const m = pattern.exec(path);
    if (!m) continue;
    const show = async () => {
      try { await page(main, params, ...m.slice(1).map(decodeURIComponent)); }
      catch (e) { main.replaceChildren(el("p", { class: "error", id: "page-error" }, e.message)); }
      main.dataset.loaded = path;
    };
    delete main.dataset.loaded;
    await show();
    if (refresh) refreshTimer = setInterval(show, REFRESH_MS);
    return;
  }
  main.replaceChildren(el("p", { class: "error" }, `No page ${path}`));
}

window.addEventListener("hashchange", route);
route();
