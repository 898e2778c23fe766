// tracetorch's HTML report: the profile's tree, the per-layer table, the summary and metadata.
// Plain ES5-style JavaScript, no framework. tracetorch/report/html.py inlines this file after
// charts.js inside one function scope, with the data in two JSON script elements.
// Names and every other datum reach the page through textContent, never as HTML, and a name
// with control or bidi characters as the text report prints it (see displayed()).

// ---------------------------------------------------------------- numbers, as units.py prints
var COUNT_PREFIXES = ["", "K", "M", "G", "T", "P", "E"];
var TIME_UNITS = ["ns", "us", "ms", "s"];
var MISSING = "-";

// Three significant figures and the power of 1000 used; integers below 1000 stay exact.
function split3(value, steps) {
  if (Number.isInteger(value) && Math.abs(value) < 1000) return [String(value), 0];
  var sign = value < 0 ? "-" : "", m = Math.abs(value), i = 0;
  while (m >= 1000 && i < steps - 1) { m /= 1000; i++; }
  var r = Number(m.toPrecision(3));
  if (r >= 1000 && i < steps - 1) { r /= 1000; i++; }
  if (r >= 1000) return [sign + m.toFixed(0), i];
  if (r < 1) return [sign + String(r), i];
  return [sign + r.toFixed(r < 10 ? 2 : r < 100 ? 1 : 0), i];
}
function withUnit(n, unit) { var s = split3(n, 7); return s[0] + " " + COUNT_PREFIXES[s[1]] + unit; }
function fmtCount(n) { var s = split3(n, 7); return s[1] ? s[0] + " " + COUNT_PREFIXES[s[1]] : s[0]; }
function fmtFlops(n) { return withUnit(n, "FLOPs"); }
function fmtMacs(n) { return n === null ? MISSING : withUnit(n, "MACs"); }
// Sizes in binary units (KiB = 1024 B), as units.format_bytes and allocators print them.
var BYTE_UNITS = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
function fmtBytes(n) {
  if (n === null) return MISSING;
  if (Number.isInteger(n) && Math.abs(n) < 1024) return String(n) + " B";
  var m = Math.abs(n), i = 0;
  while (m >= 1024 && i < BYTE_UNITS.length - 1) { m /= 1024; i++; }
  var r = Number(m.toPrecision(3));
  if (r >= 1000 && i < BYTE_UNITS.length - 1) { r = Number((m / 1024).toPrecision(3)); i++; }
  var text = r < 1 ? String(r) : r.toFixed(r < 10 ? 2 : r < 100 ? 1 : 0);
  return (n < 0 ? "-" : "") + text + " " + BYTE_UNITS[i];
}
// FLOPs per byte as the text table prints it: three significant figures, whole above 1000.
function fmtIntensity(v) {
  if (v === null) return MISSING;
  return v < 1000 ? String(Number(v.toPrecision(3))) : v.toFixed(0);
}
function fmtTime(ns) { var s = split3(ns, 4); return s[0] + " " + TIME_UNITS[s[1]]; }
function fmtRate(flops, ns) { return ns > 0 ? withUnit(flops * 1e9 / ns, "FLOP/s") : MISSING; }
function fmtPercent(part, whole) { return whole ? (100 * part / whole).toFixed(1) + "%" : MISSING; }
function exact(n) { return n === null || n === undefined ? "" : Number(n).toLocaleString("en-US"); }

// ---------------------------------------------------------------- the tree, flattened
// One record per node (index = depth-first position, root 0) with the text report's derived
// quantities: inclusive FLOPs/MACs/backward, self time, completeness, bytes.
// What the page shows for a name, type or path: the text report's escapes of its control and
// bidi characters (units.printable, computed by html.py into report.escaped), else itself:
// the names, types and paths of the nodes and the strings of the run's metadata.
var ESCAPED = {};
function displayed(text) {
  return Object.prototype.hasOwnProperty.call(ESCAPED, text) ? ESCAPED[text] : text;
}

function buildNodes(root) {
  var nodes = [], stack = [[root, -1, 0]];
  while (stack.length) {
    var top = stack.pop(), raw = top[0];
    var node = {
      id: nodes.length, raw: raw, parent: top[1], depth: top[2], kids: [],
      name: displayed(raw.name), type: displayed(raw.type), kind: raw.kind, calls: raw.time.count,
      memory: measured(raw.memory)
    };
    node.label = nodeLabel(node);
    // The exact path keys the Python side's tables; shownPath is what the page prints.
    node.path = top[1] > 0 && nodes[top[1]].path
      ? (raw.name ? nodes[top[1]].path + "." + raw.name : nodes[top[1]].path)
      : (raw.kind === "root" ? "" : raw.name);
    node.shownPath = displayed(node.path);
    if (top[1] >= 0) nodes[top[1]].kids.push(node.id);
    nodes.push(node);
    for (var i = raw.children.length - 1; i >= 0; i--) stack.push([raw.children[i], node.id, top[2] + 1]);
  }
  // Children come after their parent, so a reverse sweep sees every subtree complete.
  for (var k = nodes.length - 1; k >= 0; k--) {
    var n = nodes[k], r = n.raw, kidsNs = 0, bwd = r.backward_time.count ? r.backward_time.total_ns : null;
    n.flops = r.flops; n.macs = r.macs; n.bwdFlops = r.backward_flops; n.bwdNs = bwd;
    // Saved for backward: the subtree's, as the text table's Saved column (inclusive).
    n.saved = n.memory ? n.memory.saved_bytes || 0 : 0;
    n.kids.forEach(function (c) {
      var kid = nodes[c];
      kidsNs += kid.raw.time.total_ns;
      n.flops += kid.flops; n.bwdFlops += kid.bwdFlops; n.saved += kid.saved;
      if (kid.macs !== null) n.macs = (n.macs || 0) + kid.macs;
      if (kid.bwdNs !== null) n.bwdNs = (n.bwdNs || 0) + kid.bwdNs;
    });
    n.totalNs = r.kind === "thread" || r.kind === "root" ? kidsNs : r.time.total_ns;
    n.selfNs = Math.max(0, r.time.total_ns - kidsNs);
    n.completeness = r.completeness;  // saved with the node, as CallNode.completeness derives it
    n.bytes = n.memory ? bytesMoved(n.memory, n.calls) || null : null;
  }
  return nodes;
}

// A node's memory figures, or null when none was measured (all zeros: profile(memory=False)).
function measured(mem) {
  return mem && Object.keys(mem).some(function (k) { return mem[k]; }) ? mem : null;
}

function nodeLabel(node) {
  if (!node.name || node.name === node.type) return node.type || node.name || "(all)";
  return node.type ? node.name + " (" + node.type + ")" : node.name;
}

// The memory interface's convention: inputs and parameters read once, outputs written once.
function bytesMoved(mem, calls) {
  return (mem.input_bytes || 0) + (mem.output_bytes || 0) + (mem.param_bytes || 0) * calls;
}

// A layer's bottleneck label, wherever the profile keeps one (on the node or result-level).
function bottleneckOf(node, data) {
  var own = node.raw.bottleneck, table = data.bottleneck && data.bottleneck.labels;
  if (own === undefined && table) own = table[node.path];
  if (own && typeof own === "object") own = own.label;
  return typeof own === "string" ? own : null;
}

// "layers.2" before "layers.10": digit runs compare as numbers.
function naturalCompare(a, b) {
  var ra = a.toLowerCase().match(/\d+|\D+/g) || [], rb = b.toLowerCase().match(/\d+|\D+/g) || [];
  for (var i = 0; i < Math.min(ra.length, rb.length); i++) {
    if (ra[i] === rb[i]) continue;
    var na = /^\d/.test(ra[i]), nb = /^\d/.test(rb[i]);
    if (na && nb) return Number(ra[i]) - Number(rb[i]);
    if (na !== nb) return na ? -1 : 1;
    return ra[i] < rb[i] ? -1 : 1;
  }
  return ra.length - rb.length;
}

// ---------------------------------------------------------------- DOM helpers
function el(tag, attrs, children) {
  var node = document.createElement(tag);
  Object.keys(attrs || {}).forEach(function (k) {
    if (k === "text") node.textContent = attrs[k];
    else if (k === "className") node.className = attrs[k];
    else node.setAttribute(k, attrs[k]);
  });
  (children || []).forEach(function (c) { if (c) node.appendChild(c); });
  return node;
}
function section(id, title, children) {
  return el("section", {id: id, className: "tt-card"}, [el("h2", {text: title})].concat(children));
}
function readJson(id) { return JSON.parse(document.getElementById(id).textContent); }

// ---------------------------------------------------------------- summary and metadata
function timeByKind(nodes) {
  var shares = {forward: 0, backward: 0, optimizer: 0};
  nodes[0].kids.forEach(function (c) {
    var n = nodes[c];
    shares[n.kind in shares ? n.kind : "forward"] += n.totalNs;
  });
  return shares;
}

function renderSummary(data, report, nodes) {
  var root = nodes[0], shares = timeByKind(nodes), whole = shares.forward + shares.backward + shares.optimizer;
  var tiles = el("div", {className: "tt-tiles"});
  function tile(label, value, note) {
    tiles.appendChild(el("div", {className: "tt-tile"}, [
      el("div", {className: "tt-tile-label", text: label}), el("div", {className: "tt-tile-value", text: value}),
      note ? el("div", {className: "tt-tile-note", text: note}) : null]));
  }
  var forward = 0;
  nodes.forEach(function (n) { if (n.kind !== "backward" && n.kind !== "recompute") forward += n.raw.flops; });
  tile("Total time", fmtTime(root.totalNs), root.kids.length + " top-level call paths");
  tile("Forward FLOPs", fmtFlops(forward) + (root.completeness === "complete" ? "" : "+"),
       root.completeness === "complete" ? "complete count" : "a lower bound");
  if (root.bwdFlops) tile("Backward FLOPs", fmtFlops(root.bwdFlops), null);
  tile("Throughput", fmtRate(forward + root.bwdFlops, root.totalNs), "all FLOPs / total time");
  if (data.step_times.count) tile("Steps", fmtCount(data.step_times.count), "mean " + fmtTime(data.step_times.mean_ns));
  tile("Layers", fmtCount(nodes.length - 1), "call paths in the tree");

  var bar = el("div", {className: "tt-shares", role: "img", "aria-label": "time by kind"}), legend = el("div", {className: "tt-legend"});
  Object.keys(shares).forEach(function (kind) {
    if (!shares[kind] || !whole) return;
    var pct = 100 * shares[kind] / whole;
    bar.appendChild(el("div", {className: "tt-share tt-kind-" + kind, style: "width:" + pct + "%",
                                title: kind + " " + pct.toFixed(1) + "%"}));
    legend.appendChild(el("span", {className: "tt-key"}, [el("i", {className: "tt-kind-" + kind}),
      document.createTextNode(kind + " " + pct.toFixed(1) + "% (" + fmtTime(shares[kind]) + ")")]));
  });
  var lines = el("dl", {className: "tt-lines"});
  report.summary.forEach(function (pair) {
    lines.appendChild(el("dt", {text: pair[0]}));
    lines.appendChild(el("dd", {text: pair[1]}));
  });
  // What follows the labelled lines (the bottleneck report) keeps the text report's layout.
  var notes = report.notes ? el("pre", {className: "tt-notes", text: report.notes}) : null;
  return section("tt-summary", "Summary", [tiles, whole ? el("h3", {text: "Where the time went"}) : null,
    whole ? bar : null, whole ? legend : null, lines, notes]);
}

// A merged distributed profile: one row per rank, side by side, and the straggler's evidence.
function ranksSection(ranks) {
  var time = function (v) { return v === undefined || v === null ? MISSING : fmtTime(v); };
  var heads = ["Rank", "Host", "Device", "Backend", "Steps", "Step p50", "Compute", "In collectives",
    "Layer calls", "FLOPs"];
  var body = el("tbody");
  Object.keys(ranks.ranks).map(Number).sort(function (a, b) { return a - b; }).forEach(function (r) {
    var row = ranks.ranks[r], slow = ranks.straggler && ranks.straggler.rank === r;
    var cells = [String(r), row.host || MISSING, row.device || MISSING, row.backend || MISSING,
      String(row.steps || 0), time(row.step_median_ns), time(row.compute_ns), time(row.collective_ns),
      fmtCount(row.layer_calls || 0), fmtFlops(row.flops || 0)];
    body.appendChild(el("tr", {className: slow ? "tt-straggler" : ""},
      cells.map(function (c, i) { return el("td", {text: displayed(c), className: i > 3 ? "tt-num" : ""}); })));
  });
  var head = el("thead", {}, [el("tr", {}, heads.map(function (h) { return el("th", {text: h}); }))]);
  var shown = Object.keys(ranks.ranks).length, parts = [
    el("p", {text: shown + " of " + (ranks.world_size || shown) + " ranks"}),
    el("table", {className: "tt-ranks-table"}, [head, body])];
  var s = ranks.straggler;
  if (s) {
    parts.push(el("p", {className: "tt-straggler-note", text: "Straggler: rank " + s.rank + ", compute " +
      time(s.compute_ns) + ", " + time(s.excess_ns) + " over the other ranks' median (" +
      time(s.others_median_ns) + "); it waits " + time(s.wait_ns) + " in collectives, they wait " +
      time(s.others_wait_median_ns) + "."}));
    (s.layers || []).forEach(function (l) {
      parts.push(el("p", {className: "tt-straggler-note", text: displayed(l.path) + ": +" +
        time(l.rank_ns - l.others_median_ns) + " self time (" + time(l.rank_ns) + " against " +
        time(l.others_median_ns) + ")"}));
    });
  }
  return section("tt-ranks", "Ranks", parts);
}

function metaText(value) {
  if (value === null || typeof value !== "object") return displayed(String(value));
  if (Array.isArray(value)) return value.map(metaText).join(" ");
  return Object.keys(value).map(function (k) { return displayed(k) + " " + metaText(value[k]); }).join(", ");
}

function renderMeta(data, report) {
  var rows = el("tbody"), meta = data.meta;
  // A merge's per-rank facts have their own section (Ranks); here they would be one huge line.
  var keys = Object.keys(meta).sort().filter(function (k) { return !(k === "distributed" && data.ranks); });
  keys.forEach(function (k) {
    rows.appendChild(el("tr", {}, [el("th", {text: displayed(k)}), el("td", {text: metaText(meta[k])})]));
  });
  rows.appendChild(el("tr", {}, [el("th", {text: "report"}), el("td", {text: "tracetorch " + report.version +
    ", profile format " + data.format + " v" + data.version}) ]));
  return section("tt-meta", "Run", [el("table", {className: "tt-kv"}, [rows])]);
}

// ---------------------------------------------------------------- the per-layer table
// One list of columns; a column is shown only when the data has what it needs.
function tableColumns(data, nodes) {
  var grand = nodes[0].totalNs;
  var hasBackward = nodes.some(function (n) { return n.raw.backward_time.count || n.raw.backward_flops; });
  var hasMemory = nodes.some(function (n) { return n.memory; });
  var hasField = function (key) { return nodes.some(function (n) { return n.memory && n.memory[key]; }); };
  var hasLabel = nodes.some(function (n) { return bottleneckOf(n, data) !== null; });
  function memory(key, title) {
    return {key: key, title: title, show: hasField(key), value: function (n) { return n.memory && n.memory[key] ? n.memory[key] : null; }, fmt: fmtBytes};
  }
  var isBwd = function (n) { return n.kind === "backward"; };
  var columns = [
    {key: "name", title: "Name", show: true, value: function (n) { return n.name || n.type; }, fmt: null},
    {key: "calls", title: "Calls", show: true, value: function (n) { return n.calls; }, fmt: fmtCount},
    {key: "flops", title: "FLOPs", show: true, value: function (n) { return n.flops; },
     fmt: function (v, n) { return n.completeness === "unknown" ? "?" : fmtFlops(v) + (n.completeness === "partial" ? "+" : ""); }},
    {key: "macs", title: "MACs", show: true, value: function (n) { return n.macs; }, fmt: fmtMacs},
    {key: "self", title: "Self time", show: true, value: function (n) { return n.selfNs; }, fmt: fmtTime},
    {key: "total", title: "Total time", show: true, value: function (n) { return n.totalNs; }, fmt: fmtTime},
    {key: "percent", title: "% time", show: true, value: function (n) { return grand ? n.totalNs / grand : null; },
     fmt: function (v, n) { return fmtPercent(n.totalNs, grand); }},
    {key: "rate", title: "FLOP/s", show: true, value: function (n) { return n.totalNs ? n.flops * 1e9 / n.totalNs : null; },
     fmt: function (v, n) { return fmtRate(n.flops, n.totalNs); }},
    {key: "bwd_time", title: "Bwd time", show: hasBackward, value: function (n) { return isBwd(n) ? n.totalNs : n.bwdNs; },
     fmt: function (v) { return v === null ? MISSING : fmtTime(v); }},
    {key: "bwd_flops", title: "Bwd FLOPs", show: hasBackward, value: function (n) { return isBwd(n) ? n.flops : n.bwdFlops; }, fmt: fmtFlops},
    memory("input_bytes", "Input"), memory("output_bytes", "Output"),
    memory("param_bytes", "Param bytes"),
    {key: "saved", title: "Saved", show: hasField("saved_bytes"), value: function (n) { return n.saved || null; }, fmt: fmtBytes},
    memory("device_peak_bytes", "Device peak"),
    {key: "bytes", title: "Bytes moved", show: hasMemory, value: function (n) { return n.bytes; }, fmt: fmtBytes},
    {key: "intensity", title: "FLOPs/B", show: hasMemory, value: function (n) { return n.bytes && n.flops ? n.flops / n.bytes : null; },
     fmt: fmtIntensity},
    {key: "label", title: "Bottleneck", show: hasLabel, value: function (n) { return bottleneckOf(n, data); },
     fmt: function (v) { return v === null ? MISSING : v; }}
  ];
  // A merged distributed profile: each layer's inclusive time across ranks, and the slowest.
  var spreads = data.ranks ? data.ranks.spreads : null;
  var spread = function (i) { return function (n) { var s = spreads[n.path]; return s ? s[i] : null; }; };
  if (spreads) {
    var time = function (v) { return v === null ? MISSING : fmtTime(v); };
    columns.push({key: "rank_min", title: "Rank min", show: true, value: spread(0), fmt: time},
                 {key: "rank_median", title: "Rank median", show: true, value: spread(1), fmt: time},
                 {key: "rank_max", title: "Rank max", show: true, value: spread(2), fmt: time},
                 {key: "slowest_rank", title: "Slowest rank", show: true, value: spread(3),
                  fmt: function (v) { return v === null ? MISSING : String(v); }});
  }
  return columns.filter(function (c) { return c.show; });
}

var ROW_HEIGHT = 24;      // px; fixed, so only the rows in view need to exist (the CSS agrees)
var ROW_OVERSCAN = 30;    // rows drawn beyond the view on each side

function LayerTable(data, nodes, onPick) {
  var self = this;
  this.nodes = nodes; this.columns = tableColumns(data, nodes); this.onPick = onPick;
  this.sortKey = "total"; this.descending = true; this.filter = "";
  this.maxDepth = nodes.reduce(function (m, n) { return Math.max(m, n.depth); }, 0);
  // Small trees open fully; a big one opens two levels deep.
  this.expanded = {};
  this.expandTo(nodes.length <= 400 ? this.maxDepth : 2);

  var depthPick = el("select", {id: "tt-depth", "aria-label": "expand to depth"});
  for (var d = 1; d <= this.maxDepth; d++) depthPick.appendChild(el("option", {value: String(d), text: "depth " + d}));
  depthPick.value = String(Math.min(this.openDepth, this.maxDepth));
  depthPick.addEventListener("change", function () { self.expandTo(Number(depthPick.value)); self.refresh(); });
  var search = el("input", {id: "tt-filter", type: "search", placeholder: "Filter by name or path", "aria-label": "filter"});
  search.addEventListener("input", function () { self.filter = search.value.trim().toLowerCase(); self.refresh(); });
  this.count = el("span", {className: "tt-count"});

  this.head = el("tr");
  this.columns.forEach(function (c) {
    var th = el("th", {"data-key": c.key, scope: "col", className: c.key === "name" ? "tt-name" : "tt-num",
                       title: "Sort by " + c.title}, [el("span", {text: c.title})]);
    th.addEventListener("click", function () { self.sortBy(c.key); });
    self.head.appendChild(th);
  });
  this.body = el("tbody");
  this.scroller = el("div", {className: "tt-scroll"}, [el("table", {id: "tt-table"}, [el("thead", {}, [this.head]), this.body])]);
  this.scroller.addEventListener("scroll", function () {
    if (!self.pending) { self.pending = true; requestAnimationFrame(function () { self.pending = false; self.draw(); }); }
  });
  this.element = section("tt-layers", "Layers", [
    el("div", {className: "tt-toolbar"}, [search, depthPick, this.count]), this.scroller,
    el("p", {className: "tt-legend-text", text: "FLOPs, MACs, FLOP/s, Total time and the Bwd columns include children; " +
      "Self time excludes them. FLOPs+ = a lower bound, ? = unknown FLOPs. Click a header to sort, a triangle to fold, a name to zoom the icicle."})]);
  this.refresh();
}

LayerTable.prototype.expandTo = function (depth) {
  var open = this.expanded = {};
  this.openDepth = depth;
  this.nodes.forEach(function (n) { if (n.depth < depth) open[n.id] = true; });
};

LayerTable.prototype.sortBy = function (key) {
  this.descending = this.sortKey === key ? !this.descending : key !== "name";
  this.sortKey = key;
  this.refresh();
};

LayerTable.prototype.compare = function () {
  var column = this.columns.filter(function (c) { return c.key === this.sortKey; }, this)[0];
  var sign = this.descending ? -1 : 1;
  if (column.key === "name") return function (a, b) { return sign * naturalCompare(column.value(a), column.value(b)); };
  return function (a, b) {
    var va = column.value(a), vb = column.value(b);
    if (va === vb) return a.id - b.id;          // ties keep call order
    if (va === null) return 1;                  // undefined values last, either direction
    if (vb === null) return -1;
    return sign * (va < vb ? -1 : 1);
  };
};

// The rows in display order: the tree with sorted siblings (children under their parent), or,
// while filtering, every matching node as a flat sorted list.
LayerTable.prototype.visibleRows = function () {
  var nodes = this.nodes, cmp = this.compare(), filter = this.filter;
  if (filter) {
    return nodes.slice(1).filter(function (n) {
      return n.label.toLowerCase().indexOf(filter) >= 0 || n.shownPath.toLowerCase().indexOf(filter) >= 0;
    }).sort(cmp);
  }
  var rows = [], stack = nodes[0].kids.map(function (i) { return nodes[i]; }).sort(cmp).reverse();
  while (stack.length) {
    var n = stack.pop();
    rows.push(n);
    if (this.expanded[n.id]) {
      var kids = n.kids.map(function (i) { return nodes[i]; }).sort(cmp);
      for (var k = kids.length - 1; k >= 0; k--) stack.push(kids[k]);
    }
  }
  return rows;
};

LayerTable.prototype.refresh = function () {
  var self = this;
  this.rows = this.visibleRows();
  Array.prototype.forEach.call(this.head.children, function (th) {
    var on = th.getAttribute("data-key") === self.sortKey;
    th.setAttribute("aria-sort", on ? (self.descending ? "descending" : "ascending") : "none");
  });
  this.count.textContent = this.rows.length + " of " + (this.nodes.length - 1) + " rows";
  this.drawnFrom = -1;
  this.draw();
};

LayerTable.prototype.draw = function () {
  var view = this.scroller.clientHeight || 600, rows = this.rows;
  var from = Math.max(0, Math.floor(this.scroller.scrollTop / ROW_HEIGHT) - ROW_OVERSCAN);
  var to = Math.min(rows.length, from + Math.ceil(view / ROW_HEIGHT) + 2 * ROW_OVERSCAN);
  if (from === this.drawnFrom && to === this.drawnTo) return;
  this.drawnFrom = from; this.drawnTo = to;
  var body = this.body, span = this.columns.length;
  body.textContent = "";
  var spacer = function (rowsSkipped) {
    return rowsSkipped ? el("tr", {className: "tt-spacer", style: "height:" + rowsSkipped * ROW_HEIGHT + "px"}, [el("td", {colspan: String(span)})]) : null;
  };
  var fragment = document.createDocumentFragment();
  if (spacer(from)) fragment.appendChild(spacer(from));
  for (var i = from; i < to; i++) fragment.appendChild(this.row(rows[i]));
  if (spacer(rows.length - to)) fragment.appendChild(spacer(rows.length - to));
  body.appendChild(fragment);
};

LayerTable.prototype.row = function (n) {
  var self = this, tr = el("tr", {"data-id": String(n.id), "data-path": n.shownPath, "data-kind": n.kind,
                                  "data-depth": String(n.depth)});
  this.columns.forEach(function (c) {
    var v = c.value(n);
    if (c.key === "name") {
      var indent = self.filter ? 0 : n.depth - 1, toggle = el("button", {className: "tt-toggle", "aria-label": "fold"});
      if (n.kids.length && !self.filter) {
        toggle.textContent = self.expanded[n.id] ? "\u25be" : "\u25b8";
        toggle.addEventListener("click", function (e) {
          e.stopPropagation();
          if (self.expanded[n.id]) delete self.expanded[n.id]; else self.expanded[n.id] = true;
          self.refresh();
        });
      } else toggle.setAttribute("disabled", "");
      var name = el("span", {className: "tt-label", text: self.filter ? (n.shownPath || n.label) + (n.path && n.type ? " (" + n.type + ")" : "") : n.label});
      name.addEventListener("click", function () { self.onPick(n.id); });
      tr.appendChild(el("td", {className: "tt-name", style: "padding-left:" + (6 + 16 * indent) + "px", title: n.shownPath || n.label}, [toggle, name]));
      return;
    }
    var cell = el("td", {className: "tt-num", "data-key": c.key, text: c.fmt(v, n)});
    if (v !== null && v !== undefined) {
      cell.setAttribute("data-value", String(v));
      if (typeof v === "number" && Number.isInteger(v)) cell.title = exact(v);
    }
    tr.appendChild(cell);
  });
  return tr;
};

// ---------------------------------------------------------------- the page
function main() {
  performance.mark("tt-start");
  var data = readJson("tt-profile"), report = readJson("tt-report");
  ESCAPED = report.escaped || {};
  // Labels the Python side derived (the bottleneck analysis), where the profile has them.
  if (report.bottleneck && !data.bottleneck) data.bottleneck = report.bottleneck;
  if (report.ranks) data.ranks = report.ranks;
  var nodes = buildNodes(data.root);
  var app = document.getElementById("tt-app");
  var meta = data.meta, subtitle = [meta.date, meta.device, meta.framework].filter(Boolean).map(displayed).join(" \u00b7 ");
  app.appendChild(el("header", {className: "tt-header"}, [el("h1", {text: report.title}),
    subtitle ? el("p", {className: "tt-subtitle", text: subtitle}) : null]));
  app.appendChild(renderSummary(data, report, nodes));
  var icicle = new Icicle(nodes);
  var table = new LayerTable(data, nodes, function (id) { icicle.zoom(id); icicle.element.scrollIntoView({block: "nearest"}); });
  app.appendChild(icicle.element);
  app.appendChild(table.element);
  icicle.draw();
  performance.mark("tt-table-icicle");
  var roofline = rooflineSection(nodes, data);
  if (roofline) app.appendChild(roofline);
  if (data.ranks) app.appendChild(ranksSection(data.ranks));
  app.appendChild(renderMeta(data, report));
  window.addEventListener("resize", function () { icicle.draw(); });
  // For tests and scripts: what the page shows, without scraping pixels.
  window.tracetorchReport = {nodes: nodes, table: table, icicle: icicle};
  performance.mark("tt-ready");
  document.documentElement.setAttribute("data-tt-ready", "1");
}

if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", main);
else main();
