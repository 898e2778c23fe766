// The report's two charts: the icicle of the call tree (canvas) and the roofline (SVG).
// Inlined before report.js in the same function scope: el(), section(), the fmt* helpers and
// bottleneckOf() are report.js's.

// ---------------------------------------------------------------- a shared hover tooltip
var tip = null;
function showTip(event, lines) {
  if (!tip) { tip = el("div", {id: "tt-tooltip", role: "tooltip"}); document.body.appendChild(tip); }
  tip.textContent = "";
  lines.forEach(function (line, i) { tip.appendChild(el(i ? "div" : "strong", {text: line})); });
  tip.style.display = "block";
  var x = event.clientX + 14, y = event.clientY + 14, w = tip.offsetWidth, h = tip.offsetHeight;
  tip.style.left = Math.max(4, x + w > window.innerWidth ? event.clientX - w - 10 : x) + "px";
  tip.style.top = Math.max(4, y + h > window.innerHeight ? event.clientY - h - 10 : y) + "px";
}
function hideTip() { if (tip) tip.style.display = "none"; }

function shapeText(sig) {
  if (!sig) return MISSING;
  return sig.map(function (s) { return s === null ? MISSING : "[" + s.join(", ") + "]"; }).join(", ");
}

// What a hover says about a node, in the table's units.
function nodeLines(n, nodes) {
  var all = nodes[0].totalNs, r = n.raw;
  var lines = [n.label, n.path ? "path " + n.shownPath : n.kind, "calls " + fmtCount(n.calls),
    "total " + fmtTime(n.totalNs) + " (" + fmtPercent(n.totalNs, all) + "), self " + fmtTime(n.selfNs),
    "FLOPs " + (n.completeness === "unknown" ? "unknown" : fmtFlops(n.flops) + (n.completeness === "partial" ? " (lower bound)" : "")) +
      ", " + fmtRate(n.flops, n.totalNs)];
  if (n.macs !== null) lines.push("MACs " + fmtMacs(n.macs));
  if (n.bwdNs !== null || n.bwdFlops) lines.push("backward " + (n.bwdNs === null ? MISSING : fmtTime(n.bwdNs)) + ", " + fmtFlops(n.bwdFlops));
  if (n.bytes !== null) lines.push("bytes moved " + fmtBytes(n.bytes) + (n.bytes ? ", " + (n.flops / n.bytes).toPrecision(3) + " FLOP/B" : ""));
  if (r.params) lines.push("parameters " + fmtCount(r.params));
  if (r.input_shapes && r.input_shapes.length) lines.push("in " + shapeText(r.input_shapes[0]) + " \u2192 out " + shapeText(r.output_shapes[0]));
  return lines;
}

// ---------------------------------------------------------------- icicle
var ICICLE_ROW = 22;          // px per tree level
var ICICLE_LEVELS = 40;       // levels drawn below the zoomed node; deeper ones need a zoom
var MIN_BOX = 0.4;            // px; narrower boxes (and their subtrees) are not drawn
var MODULE_COLOURS = ["#f2a65a", "#eec170", "#e8816b", "#f4c48c", "#d99a6c", "#f0b37e", "#e5a0a0", "#f5d491", "#e39b55", "#f7b7a3"];
var KIND_COLOURS = {root: "#c3cad4", backward: "#8fb3de", optimizer: "#94c9a9", function: "#b9a6dd",
                    recompute: "#c9c2b8", thread: "#cdd3da"};

var METRICS = [
  {key: "time", title: "Time", own: function (n) { return n.totalNs; }, fmt: fmtTime},
  {key: "flops", title: "FLOPs", own: function (n) { return n.flops; }, fmt: fmtFlops},
  {key: "bytes", title: "Bytes", own: function (n) { return n.bytes || 0; }, fmt: fmtBytes, memory: true},
  {key: "calls", title: "Calls", own: function (n) { return n.calls; }, fmt: fmtCount}
];

function colourOf(n) {
  if (n.kind !== "module") return KIND_COLOURS[n.kind] || KIND_COLOURS.thread;
  var h = 0;
  for (var i = 0; i < n.type.length; i++) h = (h * 31 + n.type.charCodeAt(i)) >>> 0;
  return MODULE_COLOURS[h % MODULE_COLOURS.length];   // one colour per layer type
}

function Icicle(nodes) {
  var self = this;
  this.nodes = nodes; this.zoomId = 0; this.boxes = [];
  this.metrics = METRICS.filter(function (m) { return !m.memory || nodes.some(function (n) { return n.memory; }); });
  this.metric = this.metrics[0]; this.weightCache = {};
  this.height = new Int32Array(nodes.length);   // levels below each node
  for (var k = nodes.length - 1; k > 0; k--) {
    var p = nodes[k].parent;
    this.height[p] = Math.max(this.height[p], this.height[k] + 1);
  }
  var buttons = el("div", {className: "tt-switch", role: "group", "aria-label": "box widths"});
  this.metrics.forEach(function (m) {
    var b = el("button", {"data-metric": m.key, text: m.title, "aria-pressed": String(m === self.metric)});
    b.addEventListener("click", function () {
      self.metric = m;
      Array.prototype.forEach.call(buttons.children, function (x) { x.setAttribute("aria-pressed", String(x === b)); });
      self.draw();
    });
    buttons.appendChild(b);
  });
  this.crumbs = el("nav", {id: "tt-crumbs", "aria-label": "zoom path"});
  this.canvas = el("canvas", {id: "tt-icicle"});
  this.wrap = el("div", {className: "tt-icicle-wrap"}, [this.canvas]);
  this.canvas.addEventListener("mousemove", function (e) {
    var box = self.hit(e);
    self.canvas.style.cursor = box ? "pointer" : "default";
    if (box) showTip(e, nodeLines(nodes[box.id], nodes)); else hideTip();
  });
  this.canvas.addEventListener("mouseleave", hideTip);
  this.canvas.addEventListener("click", function (e) {
    var box = self.hit(e);
    if (!box) return;
    // The zoomed node's own bar steps one level out; any other bar zooms in.
    self.zoom(box.id === self.zoomId && box.id ? nodes[box.id].parent : box.id);
  });
  this.element = section("tt-flame", "Call tree", [
    el("div", {className: "tt-toolbar"}, [el("span", {className: "tt-hint", text: "Widths by"}), buttons, this.crumbs]),
    this.wrap,
    el("p", {className: "tt-legend-text", text: "Each bar is a call path, as wide as its share of the parent; children sit below. " +
      "Click a bar to zoom into it, the top bar or the path above to zoom out; hover for numbers."})]);
}

// Widths nest: a box is as wide as its own value or its children together, whichever is more.
Icicle.prototype.weights = function () {
  var key = this.metric.key, cached = this.weightCache[key];
  if (cached) return cached;
  var nodes = this.nodes, w = new Float64Array(nodes.length), own = this.metric.own;
  for (var k = nodes.length - 1; k >= 0; k--) {
    var kids = 0;
    for (var j = 0; j < nodes[k].kids.length; j++) kids += w[nodes[k].kids[j]];
    w[k] = Math.max(own(nodes[k]) || 0, kids);
  }
  return (this.weightCache[key] = w);
};

Icicle.prototype.zoom = function (id) { this.zoomId = id; this.draw(); };

Icicle.prototype.hit = function (event) {
  var rect = this.canvas.getBoundingClientRect(), x = event.clientX - rect.left, y = event.clientY - rect.top;
  for (var i = this.boxes.length - 1; i >= 0; i--) {
    var b = this.boxes[i];
    if (x >= b.x && x < b.x + b.w && y >= b.y && y < b.y + ICICLE_ROW) return b;
  }
  return null;
};

Icicle.prototype.drawCrumbs = function () {
  var self = this, chain = [], id = this.zoomId;
  while (id >= 0) { chain.unshift(id); id = this.nodes[id].parent; }
  this.crumbs.textContent = "";
  chain.forEach(function (c, i) {
    if (i) self.crumbs.appendChild(el("span", {className: "tt-sep", text: "\u203a"}));
    var b = el("button", {"data-id": String(c), text: c ? self.nodes[c].label : "all",
                          "aria-current": c === self.zoomId ? "true" : "false"});
    b.addEventListener("click", function () { self.zoom(c); });
    self.crumbs.appendChild(b);
  });
};

Icicle.prototype.draw = function () {
  var nodes = this.nodes, weights = this.weights(), fmt = this.metric.fmt;
  var width = Math.max(200, this.wrap.clientWidth), levels = Math.min(this.height[this.zoomId], ICICLE_LEVELS - 1) + 1;
  var dpr = window.devicePixelRatio || 1, canvas = this.canvas, height = levels * ICICLE_ROW;
  canvas.width = Math.round(width * dpr); canvas.height = Math.round(height * dpr);
  canvas.style.width = width + "px"; canvas.style.height = height + "px";
  var ctx = canvas.getContext("2d");
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.clearRect(0, 0, width, height);
  ctx.font = "12px " + getComputedStyle(document.body).fontFamily;
  ctx.textBaseline = "middle";
  var charWidth = ctx.measureText("abcdefghijklmnopqrstuvwxyz0123456789").width / 36;
  var boxes = this.boxes = [], stack = [[this.zoomId, 0, width, 0]];
  while (stack.length) {
    var item = stack.pop(), id = item[0], x = item[1], w = item[2], level = item[3], n = nodes[id];
    var y = level * ICICLE_ROW;
    boxes.push({id: id, x: x, y: y, w: w});
    ctx.fillStyle = colourOf(n);
    ctx.fillRect(x, y, Math.max(w - 1, 0.5), ICICLE_ROW - 1);
    if (w > 36) {
      var text = (id ? n.label : "all") + "  " + fmt(this.metric.own(n) || 0);
      var fits = Math.floor((w - 10) / charWidth);
      if (text.length > fits) text = fits > 2 ? text.slice(0, fits - 1) + "\u2026" : "";
      ctx.fillStyle = "#1f2430";
      if (text) ctx.fillText(text, x + 5, y + ICICLE_ROW / 2);
    }
    if (level + 1 >= levels || !n.kids.length) continue;
    // Children left to right in call order; a parent with no weight shares its width evenly.
    var total = weights[id], cx = x;
    for (var j = 0; j < n.kids.length; j++) {
      var kid = n.kids[j], kw = total > 0 ? w * weights[kid] / total : w / n.kids.length;
      if (kw >= MIN_BOX) stack.push([kid, cx, kw, level + 1]);
      cx += kw;
    }
  }
  canvas.setAttribute("data-zoom", nodes[this.zoomId].shownPath);
  this.drawCrumbs();
};

// ---------------------------------------------------------------- roofline
var SVG = "http://www.w3.org/2000/svg";
var LABEL_COLOURS = ["#d1495b", "#00798c", "#edae49", "#30638e", "#66a182", "#8d6a9f", "#003d5b", "#e07a5f"];

function svg(tag, attrs, text) {
  var node = document.createElementNS(SVG, tag);
  Object.keys(attrs).forEach(function (k) { node.setAttribute(k, attrs[k]); });
  if (text !== undefined) node.textContent = text;
  return node;
}

function decades(lo, hi) { return [Math.floor(Math.log10(lo)), Math.ceil(Math.log10(hi))]; }

// Layers (leaves with FLOPs, bytes and time) as points: arithmetic intensity against achieved
// FLOP/s, under the machine's bandwidth slope and compute ceiling. Null when the data lacks them.
function rooflineSection(nodes, data) {
  var machine = data.machine || data.meta.machine;   // the profile keeps its peaks in meta
  if (!machine || !(machine.peak_flops > 0) || !(machine.bandwidth_bytes_per_s > 0)) return null;
  var peak = machine.peak_flops, bw = machine.bandwidth_bytes_per_s, ridge = peak / bw;
  var points, xs, ys, analysed = data.bottleneck && data.bottleneck.layers;
  if (analysed) {
    // The bottleneck analysis's own layers and numbers, as the text report prints them.
    var byPath = {};
    nodes.forEach(function (n) { if (!(n.path in byPath)) byPath[n.path] = n; });
    analysed = analysed.filter(function (l) { return l.path in byPath && l.intensity > 0 && l.achieved_flops > 0; });
    points = analysed.map(function (l) { return byPath[l.path]; });
    xs = analysed.map(function (l) { return l.intensity; });
    ys = analysed.map(function (l) { return l.achieved_flops; });
  } else {
    points = nodes.filter(function (n) {
      return !n.kids.length && n.bytes > 0 && n.flops > 0 && n.totalNs > 0 && (n.kind === "module" || n.kind === "function");
    });
    xs = points.map(function (n) { return n.flops / n.bytes; });
    ys = points.map(function (n) { return n.flops * 1e9 / n.totalNs; });
  }
  if (!points.length) return null;
  var dx = decades(Math.min(ridge, Math.min.apply(null, xs)) / 2, Math.max(ridge, Math.max.apply(null, xs)) * 2);
  var dy = decades(Math.min.apply(null, ys) / 2, Math.max(peak, Math.max.apply(null, ys)) * 2);
  var W = 760, H = 420, L = 92, R = 20, T = 16, B = 46;
  var px = function (v) { return L + (Math.log10(v) - dx[0]) / (dx[1] - dx[0]) * (W - L - R); };
  var py = function (v) { return H - B - (Math.log10(v) - dy[0]) / (dy[1] - dy[0]) * (H - T - B); };
  var chart = svg("svg", {id: "tt-roofline", viewBox: "0 0 " + W + " " + H, role: "img", "aria-label": "roofline"});
  for (var e = dx[0]; e <= dx[1]; e++) {
    chart.appendChild(svg("line", {x1: px(Math.pow(10, e)), x2: px(Math.pow(10, e)), y1: T, y2: H - B, "class": "tt-grid"}));
    chart.appendChild(svg("text", {x: px(Math.pow(10, e)), y: H - B + 18, "text-anchor": "middle"}, fmtCount(Math.pow(10, e))));
  }
  for (var f = dy[0]; f <= dy[1]; f++) {
    chart.appendChild(svg("line", {x1: L, x2: W - R, y1: py(Math.pow(10, f)), y2: py(Math.pow(10, f)), "class": "tt-grid"}));
    chart.appendChild(svg("text", {x: L - 6, y: py(Math.pow(10, f)) + 4, "text-anchor": "end"}, withUnit(Math.pow(10, f), "FLOP/s")));
  }
  chart.appendChild(svg("text", {x: (L + W - R) / 2, y: H - 6, "text-anchor": "middle", "class": "tt-axis"}, "arithmetic intensity (FLOPs per byte moved)"));
  // The ceilings: bandwidth × intensity up to the ridge point, the compute peak after it.
  var x0 = Math.max(Math.pow(10, dx[0]), Math.pow(10, dy[0]) / bw), x1 = Math.pow(10, dx[1]);
  chart.appendChild(svg("polyline", {points: [px(x0), py(bw * x0), px(ridge), py(peak), px(x1), py(peak)].join(" "), "class": "tt-roof"}));
  chart.appendChild(svg("text", {x: px(x1) - 4, y: py(peak) - 6, "text-anchor": "end", "class": "tt-roof-label"}, "peak " + withUnit(peak, "FLOP/s")));
  chart.appendChild(svg("text", {x: px(x0) + 6, y: py(bw * x0) - 8, "class": "tt-roof-label"}, withUnit(bw, "B/s")));
  var colours = {}, legend = el("div", {className: "tt-legend"});
  function colour(label) {
    if (!(label in colours)) {
      colours[label] = LABEL_COLOURS[Object.keys(colours).length % LABEL_COLOURS.length];
      legend.appendChild(el("span", {className: "tt-key"}, [el("i", {style: "background:" + colours[label]}), document.createTextNode(label)]));
    }
    return colours[label];
  }
  points.forEach(function (n, i) {
    var label = bottleneckOf(n, data) || (xs[i] < ridge ? "memory-bound" : "compute-bound");
    var dot = svg("circle", {cx: px(xs[i]), cy: py(ys[i]), r: 5.5, fill: colour(label), "class": "tt-point", "data-id": String(n.id)});
    var roof = Math.min(peak, bw * xs[i]);
    dot.addEventListener("mousemove", function (ev) {
      showTip(ev, nodeLines(n, nodes).concat([label + ": " + fmtPercent(ys[i], roof) + " of the roof at this intensity"]));
    });
    dot.addEventListener("mouseleave", hideTip);
    chart.appendChild(dot);
  });
  var caption = "Machine: peak " + withUnit(peak, "FLOP/s") + ", bandwidth " + withUnit(bw, "B/s") +
    (machine.source ? " (" + machine.source + ")" : "") + "; ridge at " + ridge.toPrecision(3) + " FLOP/B. " +
    points.length + (analysed ? " layers labelled by the bottleneck analysis." : " layers (leaves with FLOPs, bytes and time).");
  return section("tt-roof", "Roofline", [el("div", {className: "tt-chart"}, [chart]), legend, el("p", {className: "tt-legend-text", text: caption})]);
}
