// cpuprof report: draws the flame graph, the caller and callee views and the function table
// from the JSON block #data. No library; works from a file:// URL with no network.
(() => {
  "use strict";
  const D = JSON.parse(document.getElementById("data").textContent);
  const names = D.names;
  const ROW = 18; // px per frame
  const MIN_PX = 1; // narrower frames (and what they call) are not drawn
  const escaped = new Array(names.length);
  const esc = (id) => {
    if (escaped[id] === undefined) {
      escaped[id] = names[id].replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" })[c]);
    }
    return escaped[id];
  };
  const esc0 = (s) => s.replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" })[c]);
  const pct = (n, total) => (total > 0 ? (100 * n) / total : 0).toFixed(2) + "%";
  // What the widths count: CPU samples, or a heap profile's bytes or objects (D.unit, D.value).
  const unit = D.unit || "samples";
  const UNITS = ["B", "kB", "MB", "GB", "TB", "PB"];
  // Bytes as pprof prints them: the largest unit not above the value, two decimals, ".00" dropped.
  const bytes = (n) => {
    let k = 0;
    while (k + 1 < UNITS.length && n / Math.pow(1024, k + 1) >= 1) k++;
    const text = (n / Math.pow(1024, k)).toFixed(2).replace(/\.00$/, "");
    return text === "0" ? "0" : text + UNITS[k];
  };
  const cell = (n) => (unit === "bytes" ? bytes(n) : `${n}`);
  const amount = (n) => (unit === "bytes" ? bytes(n) : `${n} ${unit}`);
  let rootLabel = unit === "samples" ? "all samples" : `all (${D.value})`;

  // A call tree in preorder: per node its name id, samples (and the baseline's), depth, the
  // index just past its subtree, and its parent.
  function makeTree(name, value, base, depth) {
    const n = name.length;
    const end = new Uint32Array(n);
    const parent = new Int32Array(n);
    const open = [];
    let maxDepth = 0;
    for (let i = 0; i < n; i++) {
      const d = depth[i];
      while (open.length && depth[open[open.length - 1]] >= d) end[open.pop()] = i;
      parent[i] = open.length ? open[open.length - 1] : -1;
      open.push(i);
      if (d > maxDepth) maxDepth = d;
    }
    while (open.length) end[open.pop()] = n;
    return { n, name, value, base, depth, end, parent, maxDepth };
  }

  function fromData() {
    const flat = D.tree;
    const n = flat.length / 3;
    const name = new Uint32Array(n);
    const value = new Float64Array(n);
    const depth = new Uint16Array(n);
    for (let i = 0, k = 0; i < n; i++, k += 3) {
      name[i] = flat[k];
      value[i] = flat[k + 1];
      depth[i] = flat[k + 2];
    }
    return makeTree(name, value, D.base ? Float64Array.from(D.base) : null, depth);
  }

  // A tree built from nested maps ({name, value, base, kids: Map}) by the caller/callee views.
  function fromNested(root) {
    const name = [], value = [], base = [], depth = [];
    const walk = [[root, 0]];
    while (walk.length) {
      const [node, d] = walk.pop();
      name.push(node.name);
      value.push(node.value);
      base.push(node.base);
      depth.push(d);
      const kids = [...node.kids.values()].sort((a, b) => b.value - a.value || b.base - a.base);
      for (let k = kids.length - 1; k >= 0; k--) walk.push([kids[k], d + 1]);
    }
    return makeTree(Uint32Array.from(name), Float64Array.from(value), main.base ? Float64Array.from(base) : null, Uint16Array.from(depth));
  }
  const nested = (name) => ({ name, value: 0, base: 0, kids: new Map() });
  const child = (node, name) => {
    let c = node.kids.get(name);
    if (!c) node.kids.set(name, (c = nested(name)));
    return c;
  };

  const main = fromData();
  const total = D.total;
  const baseRoot = main.base ? main.base[0] : 0;
  const grown = new Set(D.grown);
  const shrank = new Set(D.shrank);
  let match = null; // Uint8Array over names, or null: what the search matches
  let focus = 0; // the zoomed frame of the main graph

  // Colours: warm hues by name; in a comparison, by the change of the frame's share.
  function hash(id) {
    let h = 2166136261;
    const s = names[id];
    for (let k = 0; k < s.length; k++) h = Math.imul(h ^ s.charCodeAt(k), 16777619);
    return (h >>> 0) / 4294967296;
  }
  function colour(t, i, root) {
    const id = t.name[i];
    if (!t.base) {
      const r = hash(id);
      return ["", `hsl(${Math.round(10 + 40 * r)},${Math.round(70 + 20 * r)}%,${Math.round(58 + 8 * r)}%)`];
    }
    const now = t.value[root] > 0 ? t.value[i] / t.value[root] : 0;
    const before = t.base[root] > 0 ? t.base[i] / t.base[root] : 0;
    const change = now - before;
    const strength = Math.min(1, Math.abs(change) / 0.1);
    if (change > 0 && grown.has(id)) return ["grown", `hsl(0,85%,${Math.round(80 - 30 * strength)}%)`];
    if (change < 0 && shrank.has(id)) return ["shrank", `hsl(215,85%,${Math.round(80 - 30 * strength)}%)`];
    const hue = change >= 0 ? 0 : 215;
    return ["", `hsl(${hue},${Math.round(45 * strength)}%,${Math.round(93 - 8 * strength)}%)`];
  }

  // Draws `t` zoomed on `at` into `el`: its ancestors across the whole width, its subtree
  // scaled to it. Returns the number of frames drawn.
  function render(el, t, at) {
    const width = el.clientWidth || 1000;
    const scale = t.value[at] > 0 ? width / t.value[at] : 0;
    const out = [];
    const bar = (i, x, w, cls) => {
      const [kind, fill] = colour(t, i, 0);
      const m = match && match[t.name[i]] ? " m" : "";
      const label = w >= 24 ? (i === 0 && t === main ? esc0(rootLabel) : esc(t.name[i])) : "";
      out.push(
        `<div class="fr ${cls}${kind ? " " + kind : ""}${m}" data-i="${i}" style="left:${x.toFixed(2)}px;width:${w.toFixed(2)}px;top:${t.depth[i] * ROW}px;background:${fill}">${label}</div>`
      );
    };
    for (let a = t.parent[at]; a >= 0; a = t.parent[a]) bar(a, 0, width, "anc");
    const nextX = new Float64Array(t.maxDepth + 2);
    let deepest = t.depth[at];
    for (let i = at; i < t.end[at]; ) {
      const d = t.depth[i];
      const x = nextX[d];
      const w = t.value[i] * scale;
      nextX[d] = x + w;
      if (w < MIN_PX) {
        i = t.end[i];
        continue;
      }
      nextX[d + 1] = x;
      bar(i, x, w, "");
      if (d > deepest) deepest = d;
      i++;
    }
    el.style.height = (deepest + 1) * ROW + "px";
    el.innerHTML = out.join("");
    el.tree = t;
    el.focus = at;
    return out.length;
  }

  const flame = document.getElementById("flame");
  const drawMain = () => render(flame, main, focus);

  function zoom(i) {
    focus = i;
    drawMain();
  }

  // Search: frames whose function matches are highlighted; the total counts each sample with
  // any matching frame once (the outermost match's subtree).
  const matched = document.getElementById("matched");
  function search(text) {
    if (!text) {
      match = null;
      matched.textContent = "";
      delete matched.dataset.samples;
      drawMain();
      return;
    }
    let re;
    try {
      re = new RegExp(text);
    } catch (e) {
      re = new RegExp(text.replace(/[.*+?^${}()|[\]\\]/g, "\\$&"));
    }
    match = new Uint8Array(names.length);
    let functions = 0;
    for (let id = 1; id < names.length; id++) {
      if (re.test(names[id])) {
        match[id] = 1;
        functions++;
      }
    }
    let samples = 0, before = 0;
    for (let i = 1; i < main.n; ) {
      if (match[main.name[i]]) {
        samples += main.value[i];
        if (main.base) before += main.base[i];
        i = main.end[i];
      } else i++;
    }
    matched.dataset.samples = samples;
    matched.dataset.percent = total > 0 ? (100 * samples) / total : 0;
    matched.textContent =
      `Matched ${functions} function${functions === 1 ? "" : "s"}: ${amount(samples)}, ${pct(samples, total)} of all` +
      (main.base ? ` (baseline ${pct(before, baseRoot)})` : "");
    drawMain();
  }
  const box = document.getElementById("search");
  let pending = 0;
  box.addEventListener("input", () => {
    clearTimeout(pending);
    pending = setTimeout(() => search(box.value), 120);
  });
  document.getElementById("reset").addEventListener("click", () => zoom(0));

  // The callers (inverted: the function on top, its callers under it) and callees of one
  // function, each sample counted once, at the function's outermost frame.
  const selected = document.getElementById("selected");
  function select(id) {
    const up = nested(id), down = nested(id);
    for (let i = 1; i < main.n; ) {
      if (main.name[i] !== id) {
        i++;
        continue;
      }
      const v = main.value[i], b = main.base ? main.base[i] : 0;
      let node = up;
      node.value += v;
      node.base += b;
      for (let a = main.parent[i]; a > 0; a = main.parent[a]) {
        node = child(node, main.name[a]);
        node.value += v;
        node.base += b;
      }
      const path = [down];
      down.value += v;
      down.base += b;
      const d0 = main.depth[i];
      for (let j = i + 1; j < main.end[i]; j++) {
        const d = main.depth[j] - d0;
        path.length = d;
        const c = child(path[d - 1], main.name[j]);
        c.value += main.value[j];
        if (main.base) c.base += main.base[j];
        path.push(c);
      }
      i = main.end[i];
    }
    selected.hidden = false;
    for (const el of selected.querySelectorAll(".selname")) el.textContent = names[id];
    render(document.getElementById("callers"), fromNested(up), 0);
    render(document.getElementById("callees"), fromNested(down), 0);
  }

  function showFunction(id) {
    box.value = "^" + names[id].replace(/[.*+?^${}()|[\]\\]/g, "\\$&") + "$";
    focus = 0;
    search(box.value);
    select(id);
  }

  // Tooltips and clicks on frames (any graph).
  const tip = document.getElementById("tip");
  function frameOf(ev) {
    const el = ev.target.closest(".fr");
    if (!el) return null;
    const graph = el.parentElement;
    return { graph, t: graph.tree, i: +el.dataset.i };
  }
  document.addEventListener("mousemove", (ev) => {
    const f = frameOf(ev);
    if (!f) {
      tip.hidden = true;
      return;
    }
    const { t, i } = f;
    const label = i === 0 && t === main ? rootLabel : names[t.name[i]];
    let text = `${label}\n${amount(t.value[i])}, ${pct(t.value[i], total)} of all`;
    if (f.graph.focus) text += `, ${pct(t.value[i], t.value[f.graph.focus])} of the zoomed frame`;
    if (t.base) {
      const now = t.value[0] > 0 ? (100 * t.value[i]) / t.value[0] : 0;
      const was = t.base[0] > 0 ? (100 * t.base[i]) / t.base[0] : 0;
      text += `\nbaseline ${amount(t.base[i])}: share ${was.toFixed(2)}% -> ${now.toFixed(2)}% (${(now - was >= 0 ? "+" : "") + (now - was).toFixed(2)} points)`;
      if (grown.has(t.name[i]) || shrank.has(t.name[i])) text += ", the function's change is significant";
    }
    tip.textContent = text;
    tip.hidden = false;
    tip.style.left = Math.min(ev.pageX + 12, document.documentElement.scrollWidth - 420) + "px";
    tip.style.top = ev.pageY + 16 + "px";
  });
  document.addEventListener("click", (ev) => {
    const link = ev.target.closest("a.fn, a.search");
    if (link) {
      if (link.classList.contains("search")) {
        box.value = link.dataset.re;
        focus = 0;
        search(box.value);
      } else {
        const id = link.dataset.id !== undefined ? +link.dataset.id : names.indexOf(link.dataset.fn);
        if (id > 0) showFunction(id);
      }
      return;
    }
    const f = frameOf(ev);
    if (!f) return;
    if (f.t === main) {
      zoom(f.i);
      if (f.i > 0) select(main.name[f.i]);
    } else if (f.i > 0) {
      showFunction(f.t.name[f.i]);
    }
  });

  // The function table.
  const tbody = document.querySelector("#toptable tbody");
  const SHOWN = 300;
  let sortKey = "flat", descending = true, all = false;
  function table() {
    const rows = D.functions.slice();
    const key = { flat: (r) => r[1], cum: (r) => r[2] }[sortKey];
    rows.sort((a, b) => {
      const c = key ? key(a) - key(b) : names[a[0]].localeCompare(names[b[0]]);
      const tie = b[2] - a[2] || names[a[0]].localeCompare(names[b[0]]);
      return (descending ? -c : c) || tie;
    });
    let sum = 0;
    const out = [];
    for (const [id, flat, cum] of all ? rows : rows.slice(0, SHOWN)) {
      sum += flat;
      const src = D.sources[id] ? ` <a class="srclink" href="#${D.sources[id]}">source</a>` : "";
      out.push(
        `<tr><td>${cell(flat)}</td><td>${pct(flat, total)}</td><td>${cell(cum)}</td><td>${pct(cum, total)}</td>` +
          `<td><a href="#graph" class="fn" data-id="${id}">${esc(id)}</a>${src}</td></tr>`
      );
    }
    if (!all && rows.length > SHOWN) {
      out.push(`<tr><td colspan="5"><button type="button" id="showall">Show all ${rows.length} functions</button></td></tr>`);
    }
    tbody.innerHTML = out.join("");
    for (const th of document.querySelectorAll("#toptable th")) {
      th.classList.toggle("sorted", th.dataset.k === sortKey);
    }
    const more = document.getElementById("showall");
    if (more) more.addEventListener("click", () => ((all = true), table()));
  }
  for (const th of document.querySelectorAll("#toptable th")) {
    th.addEventListener("click", () => {
      if (sortKey === th.dataset.k) descending = !descending;
      else (sortKey = th.dataset.k), (descending = th.dataset.k !== "name");
      table();
    });
  }

  // The label picker: the flame graph of the samples of one label value (D.labels[k], whose
  // per-node samples are D.groups[k]), with its share of all samples.
  if (D.labels && D.labels.length) {
    const everything = main.value, allLabel = rootLabel;
    const picker = document.getElementById("labels");
    const share = document.getElementById("labelshare");
    picker.innerHTML =
      `<option value="-1">all</option>` +
      D.labels
        .map(([k, v, n], i) => `<option value="${i}">${esc0(k)}=${esc0(v)} (${pct(n, total)})</option>`)
        .join("");
    picker.addEventListener("change", () => {
      const k = +picker.value;
      if (k < 0) {
        main.value = everything;
        rootLabel = allLabel;
        share.textContent = "";
      } else {
        const [key, value, n] = D.labels[k];
        const v = new Float64Array(main.n);
        const g = D.groups[k];
        for (let j = 0; j < g.length; j += 2) v[g[j]] = g[j + 1];
        main.value = v;
        rootLabel = `${key}=${value}`;
        share.textContent = `${amount(n)}, ${pct(n, total)} of all`;
      }
      focus = 0;
      search(box.value);
    });
    document.getElementById("picker").hidden = false;
  }

  if (main.base) {
    document.getElementById("legend").innerHTML =
      'Widths: this profile. <span class="key grown">grew</span> <span class="key shrank">shrank</span> ' +
      "(strong where the function's change is significant; pale: not significant)";
  }
  let width = 0;
  window.addEventListener("resize", () => {
    if (flame.clientWidth !== width) (width = flame.clientWidth), drawMain();
  });
  table();
  width = flame.clientWidth;
  drawMain();
  document.body.dataset.ready = "1";
  performance.mark("cpuprof-ready");
})();
