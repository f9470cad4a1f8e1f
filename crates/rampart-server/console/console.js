// The Rampart console: one page over the /v1 API. The key the user signs in with is kept in
// this tab's sessionStorage and sent as `Authorization: Bearer` (the terminal's WebSocket
// offers it as the subprotocol `rampart.key.<key>`); it never goes into a URL. Everything a
// sandbox controls (file names, output, the record) is written into the page as text, never
// as markup.
"use strict";

(() => {
  const KEY = "rampart.key";
  const view = document.getElementById("view");
  const banner = document.getElementById("banner");
  let cleanups = [];
  let me = null;

  // ---- small helpers ------------------------------------------------------------------

  // An element: h("td", {class: "num", onclick: f}, "text", child, ...).
  function h(tag, attrs, ...children) {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
      else if (k === "class") el.className = v;
      else if (k === "dataset") Object.assign(el.dataset, v);
      else el.setAttribute(k, v === true ? "" : v);
    }
    for (const c of children.flat()) {
      if (c === undefined || c === null || c === false) continue;
      el.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return el;
  }

  const fmtBytes = (n) => {
    if (n === undefined || n === null) return "–";
    const u = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    let x = Number(n);
    while (x >= 1024 && i < u.length - 1) {
      x /= 1024;
      i++;
    }
    return (i === 0 ? x.toFixed(0) : x.toFixed(x < 10 ? 1 : 0)) + " " + u[i];
  };

  function fmtAge(iso) {
    const s = Math.max(0, (Date.now() - Date.parse(iso)) / 1000);
    if (s < 60) return Math.floor(s) + " s";
    if (s < 3600) return Math.floor(s / 60) + " min";
    if (s < 86400) return Math.floor(s / 3600) + " h " + Math.floor((s % 3600) / 60) + " min";
    return Math.floor(s / 86400) + " d";
  }

  const fmtTime = (iso) => {
    const d = new Date(iso);
    return isNaN(d) ? iso : d.toLocaleString();
  };
  const fmtClock = (iso) => {
    const d = new Date(iso);
    if (isNaN(d)) return iso;
    return d.toLocaleTimeString([], { hour12: false }) + "." + String(d.getMilliseconds()).padStart(3, "0");
  };

  const limitsText = (l) =>
    `${l.cpus} vCPU · ${fmtBytes(l.memory_bytes)} · ${fmtBytes(l.disk_bytes)} disk · ${l.pids} pids`;

  function shellQuote(argv) {
    return argv
      .map((a) => (/^[\w@%+=:,./-]+$/.test(a) ? a : "'" + a.replace(/'/g, "'\\''") + "'"))
      .join(" ");
  }

  function b64bytes(text) {
    const bin = atob(text || "");
    const out = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
    return out;
  }

  function meter(frac) {
    const pct = Math.max(0, Math.min(1, frac || 0)) * 100;
    return h("span", { class: "meter" }, h("span", { style: `width:${pct.toFixed(1)}%` }));
  }

  const badge = (text, cls) => h("span", { class: "badge " + (cls || text) }, text);

  function every(ms, f) {
    let stopped = false;
    let timer = null;
    const tick = async () => {
      if (stopped) return;
      try {
        await f();
      } catch (e) {
        if (!(e instanceof ApiError && e.status === 401)) showError(e);
      }
      if (!stopped) timer = setTimeout(tick, ms);
    };
    tick();
    cleanups.push(() => {
      stopped = true;
      clearTimeout(timer);
    });
  }

  // ---- the API ------------------------------------------------------------------------

  class ApiError extends Error {
    constructor(status, code, message) {
      super(message);
      this.status = status;
      this.code = code;
    }
  }

  async function api(path, opts = {}) {
    const key = opts.key || sessionStorage.getItem(KEY);
    const init = { method: opts.method || "GET", headers: { Authorization: "Bearer " + key }, cache: "no-store" };
    if (opts.body !== undefined) {
      if (opts.body instanceof Blob) {
        init.body = opts.body;
        init.headers["Content-Type"] = "application/octet-stream";
      } else {
        init.body = JSON.stringify(opts.body);
        init.headers["Content-Type"] = "application/json";
      }
    }
    let r;
    try {
      r = await fetch(path, init);
    } catch (e) {
      throw new ApiError(0, "unreachable", "The daemon cannot be reached (" + e.message + ").");
    }
    if (!r.ok) {
      let code = "http_" + r.status;
      let message = r.statusText || "request failed";
      try {
        const b = await r.json();
        code = b.error.code;
        message = b.error.message;
      } catch (_) {
        /* not an API error body */
      }
      if (r.status === 401 && !opts.key) signOut("Signed out: " + message);
      throw new ApiError(r.status, code, message);
    }
    if (opts.raw) return r;
    if (r.status === 204) return null;
    const text = await r.text();
    return text ? JSON.parse(text) : null;
  }

  const sid = (id) => "/v1/sandboxes/" + encodeURIComponent(id);

  function showError(e, where) {
    banner.className = "banner";
    banner.replaceChildren(
      h("strong", {}, where ? where + ": " : "Error: "),
      h("span", {}, e.message || String(e)),
      e.code ? h("code", {}, e.code) : null,
      h("button", { class: "small", onclick: () => (banner.hidden = true) }, "Dismiss"),
    );
    banner.hidden = false;
  }

  function notice(text) {
    banner.className = "banner info";
    banner.replaceChildren(h("span", {}, text), h("button", { class: "small", onclick: () => (banner.hidden = true) }, "Dismiss"));
    banner.hidden = false;
  }

  // Runs an action from a button: disabled while it runs, errors in the banner.
  async function act(button, f, where) {
    if (button) button.disabled = true;
    try {
      await f();
    } catch (e) {
      showError(e, where);
    } finally {
      if (button) button.disabled = false;
    }
  }

  // ---- sign in and out ------------------------------------------------------------------

  function signOut(reason) {
    sessionStorage.removeItem(KEY);
    me = null;
    stopView();
    document.getElementById("app").hidden = true;
    document.getElementById("login").hidden = false;
    const err = document.getElementById("login-error");
    err.textContent = reason || "";
    err.hidden = !reason;
    document.getElementById("login-key").focus();
  }

  async function signIn(key) {
    me = await api("/v1/whoami", { key });
    sessionStorage.setItem(KEY, key);
    document.getElementById("login").hidden = true;
    document.getElementById("app").hidden = false;
    const who = me.kind === "key" ? `${me.name} (key ${me.key_id})` : me.kind === "socket" ? "the node's socket" : "no key";
    document.getElementById("whoami").replaceChildren(
      h("div", {}, who),
      h("div", {}, me.tenant ? "tenant " + me.tenant : "the node (administrator)"),
    );
    if (!location.hash || location.hash === "#") location.hash = "#/sandboxes";
    else render();
  }

  document.getElementById("login-form").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const input = document.getElementById("login-key");
    const err = document.getElementById("login-error");
    const key = input.value.trim();
    const button = document.getElementById("login-submit");
    button.disabled = true;
    err.hidden = true;
    try {
      await signIn(key);
      input.value = "";
    } catch (e) {
      err.textContent = e.status === 401 ? "This key is not accepted: " + e.message : e.message;
      err.hidden = false;
    } finally {
      button.disabled = false;
    }
  });
  document.getElementById("logout").addEventListener("click", () => signOut(""));

  const may = (scope) => !me || me.scopes.includes("admin") || me.scopes.includes(scope);

  // ---- routing --------------------------------------------------------------------------

  function stopView() {
    for (const c of cleanups) {
      try {
        c();
      } catch (_) {
        /* already gone */
      }
    }
    cleanups = [];
  }

  function render() {
    if (!sessionStorage.getItem(KEY) || !me) return;
    stopView();
    banner.hidden = true;
    const parts = location.hash.replace(/^#\/?/, "").split("/").map(decodeURIComponent);
    const page = parts[0] || "sandboxes";
    for (const a of document.querySelectorAll("[data-nav]")) {
      a.classList.toggle("active", a.dataset.nav === page);
    }
    view.replaceChildren(h("div", { class: "loading" }, "Loading…"));
    const pages = { sandboxes: parts[1] ? () => sandboxPage(parts[1], parts[2] || "overview") : sandboxList, snapshots, volumes, templates, usage, approvals };
    (pages[page] || notFound)();
  }
  window.addEventListener("hashchange", render);

  function notFound() {
    view.replaceChildren(h("div", { class: "panel empty" }, "There is no such page. ", h("a", { href: "#/sandboxes" }, "Go to the sandboxes.")));
  }

  // ---- the sandbox list -----------------------------------------------------------------

  const lastStats = new Map();

  // CPU use since the previous sample of the same sandbox, as a fraction of its limit.
  function cpuFraction(id, s) {
    const prev = lastStats.get(id);
    lastStats.set(id, s);
    if (!prev || s.taken_at_ms <= prev.taken_at_ms) return null;
    const used = (s.cpu_usec - prev.cpu_usec) / 1000 / (s.taken_at_ms - prev.taken_at_ms);
    return used / (s.cpus || 1);
  }

  async function sampleStats(list) {
    const out = new Map();
    await Promise.all(
      list
        .filter((s) => s.state === "running")
        .map(async (s) => {
          try {
            out.set(s.id, await api(sid(s.id) + "/stats"));
          } catch (_) {
            /* it ended between the list and the sample */
          }
        }),
    );
    return out;
  }

  function sandboxList() {
    const filter = h(
      "select",
      { id: "state-filter", onchange: () => refresh() },
      h("option", { value: "" }, "Alive"),
      ["running", "paused", "destroyed", "failed"].map((s) => h("option", { value: s }, s[0].toUpperCase() + s.slice(1))),
    );
    const count = h("span", { class: "muted" });
    const createPanel = h("div", { hidden: true });
    const newButton = h("button", { class: "primary", id: "new-sandbox", onclick: () => toggleCreate(createPanel) }, "New sandbox");
    const body = h("tbody");
    const table = h(
      "table",
      { id: "sandbox-table" },
      h("thead", {}, h("tr", {}, ["ID", "State", "Template", "Limits", "Age", "CPU", "Memory", ""].map((t, i) => h("th", { class: i === 5 || i === 6 ? "num" : undefined }, t)))),
      body,
    );
    const empty = h("div", { class: "empty", hidden: true }, "No sandboxes here. Make one with ", h("code", {}, "rampart create"), ", the API, or New sandbox.");
    // The node's warm pools (its administrator only): sandboxes launched ahead of the creates that claim them.
    const pools = h("p", { class: "hint", id: "warm-pools", hidden: true });
    view.replaceChildren(
      h("div", { class: "page-head" }, h("h1", {}, "Sandboxes"), count, h("div", { class: "spacer" }), filter, may("sandboxes") ? newButton : null),
      pools,
      createPanel,
      h("div", { class: "panel flush" }, table, empty),
    );

    async function refreshPools() {
      if (me && me.tenant) return;
      let list = [];
      try {
        list = await api("/v1/pools");
      } catch (_) {
        return;
      }
      pools.hidden = list.length === 0;
      pools.textContent =
        "Warm pools: " +
        list
          .map((p) => `${p.template}${p.isolation !== "namespace" ? " (" + p.isolation + ")" : ""}${p.network ? " with network " + p.network : ""}: ${p.ready} of ${p.size} ready${p.filling ? ", " + p.filling + " launching" : ""}`)
          .join(" · ") +
        ". A create that one can serve takes it instead of launching.";
    }

    async function refresh() {
      refreshPools();
      const q = filter.value ? "?state=" + filter.value : "";
      const list = await api("/v1/sandboxes" + q);
      list.sort((a, b) => b.created_at.localeCompare(a.created_at));
      const stats = await sampleStats(list);
      count.textContent = list.length === 1 ? "1 sandbox" : list.length + " sandboxes";
      empty.hidden = list.length > 0;
      body.replaceChildren(
        ...list.map((s) => {
          const st = stats.get(s.id);
          const cpu = st ? cpuFraction(s.id, st) : null;
          const open = () => (location.hash = "#/sandboxes/" + encodeURIComponent(s.id));
          return h(
            "tr",
            { class: "clickable", dataset: { id: s.id }, onclick: open },
            h("td", {}, h("a", { class: "mono", href: "#/sandboxes/" + encodeURIComponent(s.id) }, s.id), s.tenant ? h("div", { class: "muted" }, "tenant " + s.tenant) : null),
            h("td", {}, badge(s.state)),
            h("td", {}, s.template, s.isolation && s.isolation !== "namespace" ? h("div", { class: "muted" }, s.isolation) : null),
            h("td", { class: "muted nowrap", title: limitsText(s.limits) }, `${s.limits.cpus} vCPU · ${fmtBytes(s.limits.memory_bytes)} · ${fmtBytes(s.limits.disk_bytes)} disk`),
            h("td", { class: "nowrap" }, fmtAge(s.created_at)),
            h("td", { class: "num" }, st ? [meter(cpu), cpu === null ? "…" : (cpu * 100).toFixed(1) + " %"] : "–"),
            h("td", { class: "num" }, st ? [meter(st.memory_bytes / st.memory_limit_bytes), fmtBytes(st.memory_bytes)] : "–"),
            h(
              "td",
              { class: "num" },
              s.state === "running" || s.state === "paused"
                ? h("button", { class: "small danger", onclick: (ev) => (ev.stopPropagation(), destroy(ev.target, s.id)) }, "Destroy")
                : null,
            ),
          );
        }),
      );
    }

    async function destroy(button, id) {
      if (!confirm(`Destroy sandbox ${id}? Its processes and disk go; its record stays.`)) return;
      await act(button, async () => {
        await api(sid(id), { method: "DELETE" });
        await refresh();
      }, "Destroy");
    }
    every(2000, refresh);
  }

  async function toggleCreate(panel) {
    if (!panel.hidden) {
      panel.hidden = true;
      return;
    }
    const tpls = await api("/v1/templates").catch(() => [{ name: "base" }]);
    const template = h("select", { id: "create-template" }, tpls.map((t) => h("option", { value: t.name }, t.name)));
    const timeout = h("input", { id: "create-timeout", type: "number", min: 1, value: 600, style: "width:110px" });
    const cpus = h("input", { id: "create-cpus", type: "number", min: 0.1, step: 0.1, value: 1, style: "width:90px" });
    const mem = h("input", { id: "create-memory", type: "number", min: 16, value: 512, style: "width:110px" });
    const net = h("select", { id: "create-network" }, ["none", "allowlist", "open"].map((m) => h("option", { value: m }, m)));
    const tier = h("select", { id: "create-isolation" }, [["", "default"], ["namespace", "namespace"], ["gvisor", "gvisor"]].map(([v, l]) => h("option", { value: v }, l)));
    const allow = h("input", { id: "create-allow", placeholder: "pypi.org, *.github.com", style: "width:240px" });
    const go = h("button", { class: "primary", id: "create-submit" }, "Create");
    go.addEventListener("click", () =>
      act(go, async () => {
        const network = { mode: net.value };
        if (net.value === "allowlist") network.allow = allow.value.split(/[\s,]+/).filter(Boolean);
        const s = await api("/v1/sandboxes", {
          method: "POST",
          body: {
            template: template.value,
            timeout_secs: Number(timeout.value),
            limits: { cpus: Number(cpus.value), memory_bytes: Number(mem.value) * 1024 * 1024 },
            network,
            ...(tier.value ? { isolation: tier.value } : {}),
          },
        });
        location.hash = "#/sandboxes/" + encodeURIComponent(s.id);
      }, "Create"),
    );
    const field = (label, input) => h("div", {}, h("label", {}, label), input);
    panel.replaceChildren(
      h(
        "div",
        { class: "panel" },
        h("h2", {}, "New sandbox"),
        h("div", { class: "row" }, field("Template", template), field("Isolation", tier), field("Timeout (s)", timeout), field("vCPUs", cpus), field("Memory (MiB)", mem), field("Network", net), field("Allowed hosts", allow), go),
      ),
    );
    panel.hidden = false;
  }

  // ---- one sandbox ----------------------------------------------------------------------

  const TABS = [
    ["overview", "Overview"],
    ["terminal", "Terminal"],
    ["files", "Files"],
    ["audit", "Audit"],
    ["network", "Network"],
    ["ports", "Ports"],
  ];

  async function sandboxPage(id, tab) {
    let info;
    try {
      info = await api(sid(id));
    } catch (e) {
      view.replaceChildren(
        h("div", { class: "crumb" }, h("a", { href: "#/sandboxes" }, "Sandboxes"), " / ", id),
        h("div", { class: "panel empty" }, e.status === 404 ? `No sandbox ${id} here (it may belong to another tenant, or never existed).` : e.message),
      );
      return;
    }
    const alive = info.state === "running" || info.state === "paused";
    const actions = h("div", { class: "row" });
    const head = h(
      "div",
      { class: "page-head" },
      h("div", {}, h("div", { class: "crumb" }, h("a", { href: "#/sandboxes" }, "Sandboxes"), " / sandbox"), h("h1", { class: "mono", id: "sandbox-id" }, id)),
      badge(info.state),
      h("div", { class: "spacer" }),
      actions,
    );
    if (alive) {
      const pause = h("button", {}, info.state === "paused" ? "Resume" : "Pause");
      pause.addEventListener("click", () =>
        act(pause, async () => {
          await api(sid(id) + (info.state === "paused" ? "/resume" : "/pause"), { method: "POST" });
          render();
        }, pause.textContent),
      );
      const extend = h("button", {}, "Extend 10 min");
      extend.addEventListener("click", () =>
        act(extend, async () => {
          const s = await api(sid(id) + "/timeout", { method: "POST", body: { timeout_secs: 600 } });
          notice("The sandbox now expires at " + fmtTime(s.expires_at) + ".");
        }, "Extend"),
      );
      const destroy = h("button", { class: "danger" }, "Destroy");
      destroy.addEventListener("click", () => {
        if (!confirm(`Destroy sandbox ${id}?`)) return;
        act(destroy, async () => {
          await api(sid(id), { method: "DELETE" });
          render();
        }, "Destroy");
      });
      actions.append(pause, extend, destroy);
    }
    const tabs = h(
      "nav",
      { class: "tabs" },
      TABS.map(([k, label]) => h("a", { href: `#/sandboxes/${encodeURIComponent(id)}/${k}`, class: k === tab ? "active" : undefined, dataset: { tab: k } }, label)),
    );
    const content = h("div", { id: "tab-content" });
    view.replaceChildren(head, tabs, content);
    const tabsImpl = { overview, terminal, files, audit, network, ports };
    (tabsImpl[tab] || overview)(id, info, content);
  }

  function overview(id, info, el) {
    const fact = (label, value) => h("div", {}, h("span", {}, label), value);
    const live = h("div", { class: "facts" });
    el.replaceChildren(
      h(
        "div",
        { class: "panel" },
        h("h2", {}, "Sandbox"),
        h(
          "div",
          { class: "facts" },
          fact("Template", info.template),
          fact("Isolation", info.isolation || "namespace"),
          fact("State", info.state + (info.reason ? " (" + info.reason + ")" : "")),
          fact("Tenant", info.tenant || "the node"),
          fact("Created", fmtTime(info.created_at)),
          fact(info.ended_at ? "Ended" : "Expires", fmtTime(info.ended_at || info.expires_at)),
          fact("vCPUs", String(info.limits.cpus)),
          fact("Memory limit", fmtBytes(info.limits.memory_bytes)),
          fact("Disk", fmtBytes(info.limits.disk_bytes)),
          fact("Processes", String(info.limits.pids)),
          fact("Environment", info.env_names.length ? info.env_names.join(", ") : "none given"),
          fact("Metadata", Object.keys(info.metadata).length ? Object.entries(info.metadata).map(([k, v]) => k + "=" + v).join(", ") : "none"),
        ),
      ),
      h("div", { class: "panel" }, h("h2", {}, "Now"), live),
    );
    if (info.state !== "running") {
      live.replaceChildren(h("div", { class: "muted" }, `No live figures: the sandbox is ${info.state}.`));
      return;
    }
    every(2000, async () => {
      const s = await api(sid(id) + "/stats");
      const cpu = cpuFraction(id, s);
      live.replaceChildren(
        fact("CPU", [meter(cpu), cpu === null ? "measuring…" : (cpu * 100).toFixed(1) + " % of " + s.cpus + " vCPU"]),
        fact("Memory", [meter(s.memory_bytes / s.memory_limit_bytes), fmtBytes(s.memory_bytes) + " of " + fmtBytes(s.memory_limit_bytes)]),
        fact("Peak memory", fmtBytes(s.memory_peak_bytes)),
        fact("Processes", s.pids + " of " + s.pids_limit),
        fact("CPU time", (s.cpu_usec / 1e6).toFixed(2) + " s"),
      );
    });
  }

  // The terminal: a login shell under a PTY over the exec WebSocket.
  function terminal(id, info, el) {
    const status = h("span", { id: "term-status", class: "muted" }, "Connecting…");
    const reconnect = h("button", { class: "small", hidden: true }, "New session");
    const wrap = h("div", { class: "term-wrap", id: "terminal" });
    el.replaceChildren(h("div", { class: "term-bar" }, h("strong", {}, "Shell"), status, h("div", { class: "spacer", style: "flex:1" }), reconnect), wrap);
    if (typeof Terminal === "undefined") {
      status.textContent = "";
      wrap.replaceChildren(h("div", { class: "error-box" }, "This daemon was built without the terminal's code (xterm.js). Run scripts/console-assets.sh and rebuild."));
      return;
    }
    if (info.state !== "running") {
      status.textContent = `The sandbox is ${info.state}: no shell.`;
      return;
    }
    const term = new Terminal({
      fontFamily: '"DejaVu Sans Mono", ui-monospace, Menlo, monospace',
      fontSize: 13,
      cursorBlink: true,
      scrollback: 5000,
      theme: { background: "#10151d", foreground: "#d8dee9" },
    });
    const fit = new FitAddon.FitAddon();
    term.loadAddon(fit);
    term.open(wrap);
    fit.fit();
    let ws = null;
    const enc = new TextEncoder();
    term.onData((d) => ws && ws.readyState === 1 && ws.send(enc.encode(d)));
    term.onResize(({ cols, rows }) => ws && ws.readyState === 1 && ws.send(JSON.stringify({ type: "resize", cols, rows })));
    const onWindow = () => fit.fit();
    window.addEventListener("resize", onWindow);

    function connect() {
      reconnect.hidden = true;
      status.textContent = "Connecting…";
      const url = (location.protocol === "https:" ? "wss://" : "ws://") + location.host + sid(id) + "/exec/ws";
      ws = new WebSocket(url, ["rampart.v1", "rampart.key." + sessionStorage.getItem(KEY)]);
      ws.binaryType = "arraybuffer";
      ws.onopen = () => {
        ws.send(JSON.stringify({ cmd: ["bash", "-l"], tty: [term.cols, term.rows], env: { TERM: "xterm-256color" } }));
      };
      ws.onmessage = (m) => {
        let ev;
        try {
          ev = JSON.parse(m.data);
        } catch (_) {
          return;
        }
        if (ev.type === "start") {
          status.textContent = `Connected · bash, pid ${ev.pid} · ${term.cols}×${term.rows}`;
          term.focus();
        } else if (ev.type === "pty" || ev.type === "stdout" || ev.type === "stderr") {
          term.write(b64bytes(ev.data));
        } else if (ev.type === "exit") {
          status.textContent = ev.signal ? `The shell was ended by signal ${ev.signal}.` : `The shell exited with code ${ev.exit_code}.`;
          reconnect.hidden = false;
        } else if (ev.type === "error") {
          status.textContent = "Error: " + ev.message;
          reconnect.hidden = false;
        }
      };
      ws.onclose = (e) => {
        if (reconnect.hidden) {
          status.textContent = e.code === 1000 ? "Disconnected." : `Disconnected (the daemon refused or closed the session, code ${e.code}).`;
          reconnect.hidden = false;
        }
      };
    }
    reconnect.addEventListener("click", () => {
      term.reset();
      connect();
    });
    connect();
    cleanups.push(() => {
      window.removeEventListener("resize", onWindow);
      if (ws) ws.close();
      term.dispose();
    });
  }

  function files(id, info, el) {
    const path = h("input", { id: "file-path", value: "/home/user", spellcheck: "false" });
    const body = h("tbody");
    const up = h("button", { title: "Parent directory" }, "Up");
    const go = h("button", {}, "Open");
    const upload = h("input", { type: "file", id: "file-upload", multiple: true, hidden: true });
    const uploadButton = h("button", { class: "primary" }, "Upload…");
    const mkdir = h("button", {}, "New folder");
    const empty = h("div", { class: "empty", hidden: true }, "This directory is empty.");
    el.replaceChildren(
      h("div", { class: "pathbar" }, up, path, go, mkdir, uploadButton, upload),
      h("div", { class: "panel flush" }, h("table", { id: "file-table" }, h("thead", {}, h("tr", {}, ["Name", "Size", "Permissions", "Owner", "Modified", ""].map((t, i) => h("th", { class: i === 1 ? "num" : undefined }, t)))), body), empty),
    );
    if (info.state !== "running") {
      body.replaceChildren();
      empty.textContent = `The sandbox is ${info.state}: its files cannot be read.`;
      empty.hidden = false;
      return;
    }
    const join = (dir, name) => (dir.endsWith("/") ? dir : dir + "/") + name;

    async function load(p) {
      path.value = p;
      const list = await api(`${sid(id)}/files/list?path=${encodeURIComponent(p)}`);
      const entries = list.entries.sort((a, b) => (a.type === "dir") === (b.type === "dir") ? a.name.localeCompare(b.name) : a.type === "dir" ? -1 : 1);
      empty.hidden = entries.length > 0;
      empty.textContent = "This directory is empty.";
      body.replaceChildren(
        ...entries.map((f) => {
          const dir = f.type === "dir";
          const name = dir
            ? h("a", { href: "#", class: "file-dir", onclick: (e) => (e.preventDefault(), open(f.path)) }, f.name + "/")
            : h("span", {}, f.name, f.symlink_target ? h("span", { class: "muted" }, " → " + f.symlink_target) : null);
          const dl = dir ? null : h("button", { class: "small", dataset: { download: f.path } }, "Download");
          if (dl) dl.addEventListener("click", () => act(dl, () => download(f), "Download"));
          const rm = h("button", { class: "small danger" }, "Delete");
          rm.addEventListener("click", () => {
            if (!confirm(`Delete ${f.path}${dir ? " and everything in it" : ""}?`)) return;
            act(rm, async () => {
              await api(`${sid(id)}/files?path=${encodeURIComponent(f.path)}${dir ? "&recursive=true" : ""}`, { method: "DELETE" });
              await load(path.value);
            }, "Delete");
          });
          return h(
            "tr",
            { dataset: { path: f.path } },
            h("td", {}, name),
            h("td", { class: "num" }, dir ? "–" : fmtBytes(f.size)),
            h("td", { class: "mono" }, f.permissions),
            h("td", {}, f.owner + ":" + f.group),
            h("td", { class: "muted" }, fmtTime(f.modified_at)),
            h("td", { class: "num" }, dl, " ", rm),
          );
        }),
      );
    }
    const open = (p) => act(null, () => load(p), "Files");
    async function download(f) {
      const r = await api(`${sid(id)}/files?path=${encodeURIComponent(f.path)}`, { raw: true });
      // Typed as bytes: a blob: URL has the console's origin, so what the sandbox wrote must
      // never be something the browser would render (HTML, SVG) there.
      const url = URL.createObjectURL(new Blob([await r.arrayBuffer()], { type: "application/octet-stream" }));
      const a = h("a", { href: url, download: f.name });
      document.body.append(a);
      a.click();
      a.remove();
      setTimeout(() => URL.revokeObjectURL(url), 60000);
    }
    up.addEventListener("click", () => open(path.value.replace(/\/+[^/]*\/?$/, "") || "/"));
    go.addEventListener("click", () => open(path.value));
    path.addEventListener("keydown", (e) => e.key === "Enter" && open(path.value));
    uploadButton.addEventListener("click", () => upload.click());
    upload.addEventListener("change", () =>
      act(uploadButton, async () => {
        for (const f of upload.files) {
          await api(`${sid(id)}/files?path=${encodeURIComponent(join(path.value, f.name))}`, { method: "PUT", body: f });
        }
        notice(`Uploaded ${upload.files.length} file(s) to ${path.value}.`);
        upload.value = "";
        await load(path.value);
      }, "Upload"),
    );
    mkdir.addEventListener("click", () => {
      const name = prompt("Name of the new folder");
      if (!name) return;
      act(mkdir, async () => {
        await api(`${sid(id)}/files/mkdir`, { method: "POST", body: { path: join(path.value, name) } });
        await load(path.value);
      }, "New folder");
    });
    open(path.value);
  }

  // One line of the record, in words.
  function desktopText(b) {
    let t = b.action.replace(/_/g, " ");
    if (b.button) t += " " + b.button;
    if (b.x !== undefined && b.y !== undefined) t += ` at ${b.x},${b.y}`;
    if (b.repeat && b.repeat !== 1) t += " x" + b.repeat;
    if (b.keys) t += " " + b.keys.join(" ");
    if (b.text) t += ` ${b.text.chars} characters (not kept)`;
    if (b.width) t += ` ${b.width}x${b.height}`;
    if (b.image) t += " · " + fmtBytes(b.image.size);
    if (b.missing) t += " · no image: " + b.missing;
    return t;
  }

  function describe(body) {
    const b = body || {};
    switch (b.type) {
      case "desktop":
        return `${b.exec_id}: ${desktopText(b)}`;
      case "created":
        return `from template ${b.template}; network ${b.policy ? b.policy.mode : "none"}`;
      case "exec":
        return [h("code", {}, shellQuote(b.argv || [])), h("span", { class: "muted" }, `  as ${b.user || "default"}${b.cwd ? " in " + b.cwd : ""}${b.pty ? " · pty" : ""}${b.input ? " · stdin " + fmtBytes(b.input.size) : ""}${b.approval ? " · approved " + b.approval : ""}`)];
      case "exit": {
        const how = b.timed_out ? "timed out" : b.signal ? `killed by signal ${b.signal}` : `exit code ${b.exit_code}`;
        const out = b.stdout ? ` · stdout ${fmtBytes(b.stdout.size)}` : "";
        const err = b.stderr ? ` · stderr ${fmtBytes(b.stderr.size)}` : "";
        return `${b.exec_id}: ${how} after ${b.wall_ms} ms${out}${err}`;
      }
      case "destroyed":
        return `reason: ${b.reason}`;
      case "file": {
        const what = b.op === "move" || b.op === "rename" ? `${b.op} ${b.path} → ${b.to}` : `${b.op} ${b.path}`;
        return [what, b.size !== undefined && b.size !== null ? h("span", { class: "muted" }, ` · ${fmtBytes(b.size)}${b.digest ? " · sha256 " + b.digest.slice(0, 12) + "…" : ""}`) : null];
      }
      case "fs_diff": {
        const list = (xs) => (xs || []).map((x) => x.path);
        const added = list(b.added);
        const changed = list(b.changed);
        const removed = list(b.removed);
        return [
          `filesystem ${b.reason ? "at " + b.reason : "changes"}: ${added.length} added, ${changed.length} changed, ${removed.length} removed${b.truncated ? " (truncated)" : ""}`,
          h("div", { class: "paths mono" }, [...added.map((p) => "+ " + p), ...changed.map((p) => "~ " + p), ...removed.map((p) => "- " + p)].slice(0, 12).join("   ")),
        ];
      }
      case "network": {
        const d = b.detail || {};
        const where = b.host + (b.port ? ":" + b.port : "");
        return [`${b.kind} ${d.qtype ? d.qtype + " " : ""}${where}: `, badge(b.verdict, b.verdict === "allowed" || b.verdict === "allow" ? "allow" : "deny"), h("span", { class: "muted" }, d.rule ? ` rule ${d.rule}` : "")];
      }
      case "snapshot":
        return `snapshot ${b.name} taken`;
      case "approval_requested":
        return [`held for approval ${b.approval_id}: `, h("code", {}, b.request), h("span", { class: "muted" }, ` (rule ${b.rule})`)];
      case "approval_decided":
        return [`${b.approval_id} `, badge(b.decision, b.decision === "approved" ? "ok" : "bad"), ` by ${b.by}${b.reason ? ": " + b.reason : ""}`];
      default: {
        const rest = Object.entries(b).filter(([k]) => k !== "type" && k !== "caller");
        return rest
          .map(([k, v]) => `${k}: ${typeof v === "object" && v !== null ? JSON.stringify(v) : v}`)
          .join(" · ");
      }
    }
  }

  function audit(id, info, el) {
    const result = h("div", { class: "verify pending", id: "verify-result" }, "Verifying the record in this browser…");
    const recheck = h("button", { class: "small" }, "Verify again");
    const save = h("button", { class: "small" }, "Download bundle");
    const list = h("div", { class: "timeline", id: "timeline" });
    const count = h("span", { class: "muted" });
    const film = h("div", { class: "filmstrip", id: "filmstrip" });
    el.replaceChildren(
      result,
      film,
      h("div", { class: "page-head" }, h("h2", { style: "margin:0" }, "Timeline"), count, h("div", { class: "spacer" }), recheck, save),
      h("div", { class: "panel flush" }, list),
    );
    let after = null;
    let n = 0;
    async function more() {
      for (;;) {
        const page = await api(`${sid(id)}/audit?limit=500${after === null ? "" : "&after=" + after}`);
        for (const e of page.events) {
          const b = e.body || {};
          list.append(
            h(
              "div",
              { class: "ev", dataset: { type: b.type, seq: e.seq } },
              h("span", { class: "seq" }, "#" + e.seq),
              h("span", { class: "time", title: e.time }, fmtClock(e.time)),
              h("span", { class: "type" }, badge(b.type, b.type === "exit" ? (b.exit_code === 0 ? "ok" : "bad") : b.type === "destroyed" ? "idle" : "warn")),
              h("div", { class: "detail" }, h("div", {}, describe(b)), b.caller ? h("div", { class: "caller" }, "by " + b.caller) : null),
            ),
          );
          n++;
        }
        count.textContent = n + " events";
        if (page.next_after === null || page.next_after === undefined || page.next_after === after || page.events.length === 0) break;
        after = page.next_after;
      }
    }
    // What the agent saw: each screenshot of the verified bundle (its image is a blob there,
    // checked against its digest), with the desktop actions since the one before.
    function filmstrip(bundle) {
      const frames = [];
      let actions = [];
      for (const e of bundle.events) {
        const b = e.body || {};
        if (b.type !== "desktop") continue;
        if (b.action !== "screenshot") {
          actions.push(desktopText(b));
          continue;
        }
        const data = b.image && bundle.blobs[b.image.digest];
        frames.push(
          h(
            "figure",
            { class: "frame", dataset: { seq: e.seq } },
            data ? h("img", { src: "data:image/png;base64," + data, alt: `screenshot #${e.seq}`, loading: "lazy" }) : h("div", { class: "noimage" }, b.missing || "no image"),
            h("figcaption", {}, h("span", { class: "seq" }, "#" + e.seq + " " + fmtClock(e.time)), actions.length ? h("span", { class: "muted" }, " after " + actions.join(", ")) : null),
          ),
        );
        actions = [];
      }
      film.replaceChildren(...(frames.length ? [h("h2", {}, `What the agent saw (${frames.length} screenshots)`), h("div", { class: "frames" }, ...frames)] : []));
    }
    async function verify() {
      result.className = "verify pending";
      result.textContent = "Verifying the record in this browser…";
      try {
        const [text, key] = await Promise.all([api(`${sid(id)}/audit/bundle`, { raw: true }).then((r) => r.text()), api("/v1/audit/key")]);
        const r = await RampartVerify.verifyBundle(text, key.public_key);
        filmstrip(JSON.parse(text));
        result.className = "verify ok";
        result.replaceChildren(
          h("strong", {}, "Verified"),
          h("span", {}, `in this browser: ${r.records} records, hash-chained; the chain head is in the node's signed tree (size ${r.treeSize}); signed by key ${r.keyId.slice(0, 16)}…`),
        );
      } catch (e) {
        result.className = "verify bad";
        result.replaceChildren(h("strong", {}, "Not verified"), h("span", {}, e.message));
      }
    }
    recheck.addEventListener("click", () => act(recheck, verify));
    save.addEventListener("click", () =>
      act(save, async () => {
        const r = await api(`${sid(id)}/audit/bundle`, { raw: true });
        const url = URL.createObjectURL(new Blob([await r.arrayBuffer()], { type: "application/octet-stream" }));
        const a = h("a", { href: url, download: `${id}.audit.json` });
        document.body.append(a);
        a.click();
        a.remove();
      }, "Bundle"),
    );
    verify();
    every(3000, more);
  }

  function network(id, info, el) {
    const mode = h("select", { id: "policy-mode" }, ["none", "allowlist", "open"].map((m) => h("option", { value: m }, m)));
    const allow = h("textarea", { id: "policy-allow", rows: 5, placeholder: "one host, *.domain, CIDR or host:port per line" });
    const deny = h("textarea", { id: "policy-deny", rows: 3 });
    const save = h("button", { class: "primary", id: "policy-save" }, "Apply policy");
    const state = h("div", { class: "muted" });
    const body = h("tbody");
    const empty = h("div", { class: "empty" }, "No connections or lookups yet.");
    el.replaceChildren(
      h(
        "div",
        { class: "grid2" },
        h(
          "div",
          { class: "panel" },
          h("h2", {}, "Egress policy"),
          state,
          h("label", {}, "Mode"),
          mode,
          h("label", {}, "Allow"),
          allow,
          h("label", {}, "Deny"),
          deny,
          h("div", { style: "margin-top:12px" }, save),
        ),
        h("div", { class: "panel" }, h("h2", {}, "How it works"), h("p", { class: "muted" }, "Every DNS query and TCP connection of the sandbox goes through the node's resolver and egress proxy, which decide by name (DNS, TLS SNI, HTTP Host) and address. A change applies to new connections at once and is recorded in the sandbox's audit record.")),
      ),
      h("h2", {}, "Network log"),
      h("div", { class: "panel flush" }, h("table", { id: "netlog" }, h("thead", {}, h("tr", {}, ["Time", "Kind", "Name", "Address", "Port", "Verdict", "Rule", "Out / in"].map((t) => h("th", {}, t)))), body), empty),
    );
    let limits = {};
    const lines = (t) => t.split("\n").map((s) => s.trim()).filter(Boolean);
    async function loadPolicy() {
      const n = await api(sid(id) + "/network");
      mode.value = n.policy.mode;
      allow.value = (n.policy.allow || []).join("\n");
      deny.value = (n.policy.deny || []).join("\n");
      limits = n.policy.limits || {};
      state.textContent = n.address ? `Address ${n.address}, gateway ${n.gateway}.` : "No network device (mode none): loopback only.";
    }
    save.addEventListener("click", () =>
      act(save, async () => {
        await api(sid(id) + "/network", { method: "PUT", body: { mode: mode.value, allow: lines(allow.value), deny: lines(deny.value), limits } });
        await loadPolicy();
        notice("The policy is applied.");
      }, "Policy"),
    );
    let after = null;
    const rows = [];
    act(null, loadPolicy, "Policy");
    every(3000, async () => {
      const page = await api(`${sid(id)}/network/log?limit=500${after === null ? "" : "&after=" + after}`);
      for (const e of page.entries) {
        rows.push(
          h(
            "tr",
            {},
            h("td", { class: "muted" }, fmtClock(e.time)),
            h("td", {}, e.kind),
            h("td", { class: "mono" }, e.name || "–"),
            h("td", { class: "mono" }, (e.addrs || []).join(", ") || "–"),
            h("td", {}, e.port || "–"),
            h("td", {}, badge(e.verdict, e.verdict === "allow" ? "allow" : "deny")),
            h("td", { class: "muted" }, e.rule),
            h("td", { class: "muted" }, e.bytes_out !== undefined && e.bytes_out !== null ? fmtBytes(e.bytes_out) + " / " + fmtBytes(e.bytes_in) : "–"),
          ),
        );
        after = e.seq;
      }
      empty.hidden = rows.length > 0;
      body.replaceChildren(...rows.slice().reverse());
    });
  }

  function ports(id, info, el) {
    const body = h("tbody");
    const empty = h("div", { class: "empty", hidden: true }, "No server listens in this sandbox yet. Start one (for example python3 -m http.server 8000) and it appears here.");
    el.replaceChildren(
      h("div", { class: "panel flush" }, h("table", { id: "ports-table" }, h("thead", {}, h("tr", {}, ["Port", "State", "Access", "URL"].map((t) => h("th", {}, t)))), body), empty),
      h("p", { class: "hint" }, "A private port opens with the sandbox's access token: the link below carries it once, then the browser keeps it in a cookie for that port. Your API key is never sent to a port."),
    );
    if (info.state !== "running") {
      empty.textContent = `The sandbox is ${info.state}.`;
      empty.hidden = false;
      return;
    }
    every(3000, async () => {
      const list = await api(sid(id) + "/ports");
      empty.hidden = list.ports.length > 0;
      body.replaceChildren(
        ...list.ports.map((p) => {
          const link = p.public || !info.access_token ? p.url : p.url + (p.url.includes("?") ? "&" : "?") + "rampart_token=" + encodeURIComponent(info.access_token);
          return h(
            "tr",
            {},
            h("td", { class: "mono" }, String(p.port)),
            h("td", {}, badge(p.listening ? "listening" : "closed", p.listening ? "ok" : "idle")),
            h("td", {}, p.public ? "public" : "token"),
            h("td", {}, h("a", { href: link, target: "_blank", rel: "noopener noreferrer" }, p.url), h("div", { class: "muted mono" }, p.host_url)),
          );
        }),
      );
    });
  }

  // ---- node-wide lists -----------------------------------------------------------------

  function simpleTable(title, columns, rows, emptyText, extra) {
    view.replaceChildren(
      h("div", { class: "page-head" }, h("h1", {}, title), h("span", { class: "muted" }, rows.length + " total")),
      h(
        "div",
        { class: "panel flush" },
        rows.length
          ? h("table", {}, h("thead", {}, h("tr", {}, columns.map((c) => h("th", { class: c.num ? "num" : undefined }, c.title)))), h("tbody", {}, rows.map((r) => h("tr", {}, columns.map((c) => h("td", { class: c.num ? "num" : undefined }, c.value(r)))))))
          : h("div", { class: "empty" }, emptyText),
      ),
      extra || null,
    );
  }

  async function guarded(f, where) {
    try {
      await f();
    } catch (e) {
      view.replaceChildren(h("div", { class: "panel empty" }, e.status === 403 ? "This key may not see this page: " + e.message : e.message));
      if (e.status !== 403) showError(e, where);
    }
  }

  function snapshots() {
    guarded(async () => {
      const list = await api("/v1/snapshots");
      const del = (s) => {
        const b = h("button", { class: "small danger" }, "Delete");
        b.addEventListener("click", () => {
          if (!confirm(`Delete snapshot ${s.name}?`)) return;
          act(b, async () => {
            await api("/v1/snapshots/" + encodeURIComponent(s.name), { method: "DELETE" });
            snapshots();
          }, "Delete");
        });
        return b;
      };
      simpleTable(
        "Snapshots",
        [
          { title: "Name", value: (s) => h("span", { class: "mono" }, s.name) },
          { title: "From", value: (s) => h("a", { class: "mono", href: "#/sandboxes/" + encodeURIComponent(s.source) }, s.source) },
          { title: "Template", value: (s) => s.template },
          { title: "Memory", value: (s) => (s.memory ? "with memory" : "filesystem") },
          { title: "Size", num: true, value: (s) => fmtBytes(s.size_bytes) },
          { title: "Created", value: (s) => fmtTime(s.created_at) },
          { title: "", num: true, value: del },
        ],
        list,
        "No snapshots. Take one with rampart snapshot ID NAME or POST /v1/sandboxes/{id}/snapshots.",
      );
    }, "Snapshots");
  }

  function volumes() {
    guarded(async () => {
      const list = await api("/v1/volumes");
      simpleTable(
        "Volumes",
        [
          { title: "Name", value: (v) => h("span", { class: "mono" }, v.name) },
          { title: "Size", num: true, value: (v) => fmtBytes(v.size_mib * 1024 * 1024) },
          { title: "Used", num: true, value: (v) => [meter(v.used_bytes / (v.size_mib * 1024 * 1024)), fmtBytes(v.used_bytes)] },
          { title: "Created", value: (v) => fmtTime(v.created_at) },
        ],
        list,
        "No volumes. Make one with rampart volume create NAME or POST /v1/volumes.",
      );
    }, "Volumes");
  }

  function templates() {
    guarded(async () => {
      const list = await api("/v1/templates");
      simpleTable(
        "Templates",
        [
          { title: "Name", value: (t) => h("strong", {}, t.name) },
          { title: "Kind", value: (t) => t.kind },
          { title: "User", value: (t) => t.user || "–" },
          { title: "Layers", num: true, value: (t) => (t.layers === undefined || t.layers === null ? "–" : t.layers) },
          { title: "Size", num: true, value: (t) => (t.size_bytes ? fmtBytes(t.size_bytes) : "–") },
          { title: "Built", value: (t) => (t.created_at ? fmtTime(t.created_at) : "with the node") },
        ],
        list,
        "No templates.",
      );
    }, "Templates");
  }

  function usage() {
    guarded(async () => {
      const range = h("select", { id: "usage-range" }, [["3600", "Last hour"], ["86400", "Last 24 hours"], ["604800", "Last 7 days"], ["", "Everything"]].map(([v, t]) => h("option", { value: v }, t)));
      range.value = "86400";
      const tenant = h("select", { id: "usage-tenant" }, h("option", { value: "" }, me.tenant ? me.tenant : "Whole node"));
      if (!me.tenant && may("admin")) {
        try {
          for (const t of await api("/v1/tenants")) tenant.append(h("option", { value: t.name }, "tenant " + t.name));
        } catch (_) {
          /* no tenants to list */
        }
      }
      const out = h("div");
      view.replaceChildren(h("div", { class: "page-head" }, h("h1", {}, "Usage"), h("div", { class: "spacer" }), tenant, range), out);
      async function load() {
        const q = new URLSearchParams();
        if (range.value) q.set("from", new Date(Date.now() - Number(range.value) * 1000).toISOString());
        if (tenant.value) q.set("tenant", tenant.value);
        const r = await api("/v1/usage?" + q);
        const t = r.totals;
        const card = (label, value) => h("div", {}, h("span", {}, label), h("strong", { style: "font-size:18px" }, value));
        out.replaceChildren(
          h(
            "div",
            { class: "panel" },
            h("div", { class: "facts" }, card("Sandboxes", String(t.sandboxes)), card("vCPU-seconds", t.vcpu_seconds.toFixed(2)), card("Memory GiB-s", t.memory_gib_seconds.toFixed(1)), card("Disk GiB-s", t.disk_gib_seconds.toFixed(1)), card("Egress", fmtBytes(t.egress_bytes)), card("Commands", String(t.exec_count)), card("Running", t.running_seconds.toFixed(0) + " s"), card("Peak memory", fmtBytes(t.memory_peak_bytes))),
            h("p", { class: "hint" }, `${fmtTime(r.from)} – ${fmtTime(r.to)}. Signed by the node (key ${r.signature.key_id.slice(0, 16)}…); check it offline with rampart usage verify.`),
          ),
          h(
            "div",
            { class: "panel flush" },
            r.sandboxes.length
              ? h(
                  "table",
                  {},
                  h("thead", {}, h("tr", {}, ["Sandbox", "Tenant", "Template", "Started", "Ended", "vCPU-s", "Mem GiB-s", "Egress", "Commands"].map((x, i) => h("th", { class: i >= 5 ? "num" : undefined }, x)))),
                  h(
                    "tbody",
                    {},
                    r.sandboxes.map((s) =>
                      h(
                        "tr",
                        {},
                        h("td", {}, h("a", { class: "mono", href: "#/sandboxes/" + encodeURIComponent(s.id) }, s.id)),
                        h("td", {}, s.tenant || "–"),
                        h("td", {}, s.template),
                        h("td", { class: "muted" }, fmtTime(s.started_at)),
                        h("td", { class: "muted" }, s.ended_at ? fmtTime(s.ended_at) : "running"),
                        h("td", { class: "num" }, s.vcpu_seconds.toFixed(3)),
                        h("td", { class: "num" }, s.memory_gib_seconds.toFixed(2)),
                        h("td", { class: "num" }, fmtBytes(s.egress_bytes)),
                        h("td", { class: "num" }, String(s.exec_count)),
                      ),
                    ),
                  ),
                )
              : h("div", { class: "empty" }, "No sandbox ran in this range."),
          ),
        );
      }
      range.addEventListener("change", () => act(null, load, "Usage"));
      tenant.addEventListener("change", () => act(null, load, "Usage"));
      await load();
    }, "Usage");
  }

  // Requests held by sandboxes' approval policies, decided here (a key with `approve`).
  function approvals() {
    const body = h("tbody");
    const empty = h("div", { class: "empty" }, "Nothing is waiting for approval.");
    const count = h("span", { class: "muted" });
    view.replaceChildren(
      h("div", { class: "page-head" }, h("h1", {}, "Approvals"), count),
      h(
        "div",
        { class: "panel flush" },
        h("table", { id: "approvals-table" }, h("thead", {}, h("tr", {}, ["Command", "Sandbox", "Rule", "Asked by", "Expires", ""].map((t) => h("th", {}, t)))), body),
        empty,
      ),
      h("p", { class: "hint" }, "A held command runs exactly as it was asked once approved; denied, or not decided before it expires, it never starts. Each request and decision is in the sandbox's audit record. The key that asked may not decide its own request unless the sandbox's policy allows it."),
    );
    const decide = (a, approve, button) => {
      const reason = prompt(`${approve ? "Approve" : "Deny"} ${a.request}? Reason (recorded):`, "");
      if (reason === null) return;
      act(button, async () => {
        const d = await api(`/v1/approvals/${encodeURIComponent(a.id)}/${approve ? "approve" : "deny"}`, { method: "POST", body: reason ? { reason } : {} });
        notice(`${d.id} ${d.decision}.`);
      }, approve ? "Approve" : "Deny");
    };
    every(2000, async () => {
      let list;
      try {
        list = await api("/v1/approvals");
      } catch (e) {
        if (e.status === 403) {
          empty.textContent = "This key may not see approvals (it lacks the approve scope).";
          empty.hidden = false;
          body.replaceChildren();
          return;
        }
        throw e;
      }
      count.textContent = list.length ? list.length + " waiting" : "";
      empty.hidden = list.length > 0;
      body.replaceChildren(
        ...list.map((a) => {
          const yes = h("button", { class: "small primary", dataset: { approve: a.id } }, "Approve");
          const no = h("button", { class: "small danger", dataset: { deny: a.id } }, "Deny");
          yes.addEventListener("click", () => decide(a, true, yes));
          no.addEventListener("click", () => decide(a, false, no));
          return h(
            "tr",
            { dataset: { approval: a.id } },
            h("td", {}, h("code", {}, a.request)),
            h("td", {}, h("a", { class: "mono", href: "#/sandboxes/" + encodeURIComponent(a.sandbox_id) + "/audit" }, a.sandbox_id)),
            h("td", { class: "mono" }, a.rule),
            h("td", { class: "muted" }, a.requested_by),
            h("td", { class: "nowrap" }, fmtTime(a.expires_at)),
            h("td", { class: "num nowrap" }, yes, " ", no),
          );
        }),
      );
    });
  }

  // ---- start ----------------------------------------------------------------------------

  const saved = sessionStorage.getItem(KEY);
  if (saved) {
    signIn(saved).catch((e) => signOut(e.status === 401 ? "Signed out: " + e.message : e.message));
  } else {
    signOut("");
  }
})();
