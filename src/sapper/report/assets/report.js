/* sapper run report: draws the curves with uPlot (inlined above this script), marks
 * findings, lists them. Self-contained: no network. Every text that came from a log is put
 * in the page with textContent (never innerHTML), so a log line cannot inject markup.
 *
 * All charts share one step axis: the cursor is synchronised through uPlot's cursor.sync
 * and a zoom on one chart (drag, double-click, a finding's link) is applied to all, so a
 * loss spike lines up with the gradient norm and the loss scale at a glance.
 *
 * window.sapperReport exposes what was drawn, for tests and for the curious. */
(function () {
  "use strict";

  var api = (window.sapperReport = { ready: false, charts: {}, errors: [] });
  var DATA = JSON.parse(document.getElementById("sapper-data").textContent);
  var PALETTE = ["#1565c0", "#ef6c00", "#2e7d32", "#6a1b9a", "#00838f", "#ad1457", "#4e342e"];
  var REFERENCE = "#7b8794";
  var SEVERITY = { error: "#c62828", warning: "#d08400", info: "#1565c0" };
  var NONFINITE = "rgba(198, 40, 40, 0.85)";
  var BAND = "rgba(239, 108, 0, 0.16)";
  var CAUSE = "rgba(106, 27, 154, 0.14)";  // the diagnosed cause: first sign to symptom
  var CAUSE_MARK = "#6a1b9a";
  var HEIGHT = 240;
  var Y_AXIS = 84;  // fixed, so every chart's plot area starts at the same x: aligned steps
  var SYNC = "sapper-steps";
  var charts = [];
  var diagnosis = DATA.diagnosis || null;
  var cause = diagnosis && diagnosis.causes && diagnosis.causes.length ? diagnosis.causes[0] : null;
  var causeSteps = cause ? cause.evidence.filter(function (e) { return typeof e.step === "number"; })
    .map(function (e) { return e.step; }) : [];
  var causeSpan = causeSpanOf(cause);
  var full = fullRange();
  var view = full.slice();
  var syncing = false;
  var active = null;  // the chart under the mouse

  function el(tag, cls, text) {
    var node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  function fmt(v) {
    if (v === null || v === undefined) return "N/A";
    if (typeof v === "string") return v;
    if (!isFinite(v)) return String(v);
    var a = Math.abs(v);
    if (a !== 0 && (a < 1e-3 || a >= 1e5)) return v.toExponential(2);
    return String(+v.toPrecision(4));
  }

  function fmtStep(v) {
    return Math.round(v).toLocaleString("en-US");
  }

  /* "step 1,200" and, in a restarted log, which attempt logged it */
  function findingStep(f) {
    var attempt = f.data && typeof f.data.attempt === "number" ? ", attempt " + f.data.attempt : "";
    return "step " + fmtStep(f.step) + attempt;
  }

  /* From the first sign of the cause to the first symptom it explains (or to its last
   * evidence when the sign is all there is). */
  function causeSpanOf(c) {
    if (!c || typeof c.first_step !== "number") return null;
    var steps = c.evidence.map(function (e) { return typeof e.began === "number" ? e.began : e.step; })
      .filter(function (v) { return typeof v === "number"; });
    if (!steps.length) return null;
    var end = typeof c.steps_before_symptom === "number" && c.steps_before_symptom > 0
      ? c.first_step + c.steps_before_symptom : Math.max.apply(null, steps);
    return [c.first_step, Math.max(end, c.first_step)];
  }

  function fullRange() {
    var lo = Infinity, hi = -Infinity;
    DATA.charts.forEach(function (c) {
      c.series.forEach(function (s) {
        for (var i = 0; i < s.x.length; i++) { if (s.x[i] < lo) lo = s.x[i]; if (s.x[i] > hi) hi = s.x[i]; }
        s.nonfinite.forEach(function (r) { lo = Math.min(lo, r[0]); hi = Math.max(hi, r[1]); });
      });
    });
    if (DATA.source && typeof DATA.source.first_step === "number") {
      lo = Math.min(lo, DATA.source.first_step); hi = Math.max(hi, DATA.source.last_step);
    }
    if (!isFinite(lo)) { lo = 0; hi = 1; }
    if (hi === lo) { lo -= 1; hi += 1; }
    var pad = (hi - lo) * 0.01;  // a reading on the first or last step stays visible
    return [lo - pad, hi + pad];
  }

  /* ---- axis ticks: a handful of round numbers whatever the span (1e-30..1e30 too) ---- */
  function niceTicks(lo, hi, count) {
    var span = hi - lo;
    if (!(span > 0) || !isFinite(span)) return isFinite(lo) ? [lo] : [];
    var step = Math.pow(10, Math.floor(Math.log10(span / count)));
    var err = span / count / step;
    if (err >= 7.5) step *= 10; else if (err >= 3.5) step *= 5; else if (err >= 1.5) step *= 2;
    var first = Math.ceil(lo / step), ticks = [];
    // by index, not by adding: at 1e20 a step of 100 is below one float ulp
    for (var i = 0; i <= count * 3; i++) {
      var t = +((first + i) * step).toPrecision(12);
      if (t > hi + step * 1e-9) break;
      if (!ticks.length || t > ticks[ticks.length - 1]) ticks.push(t);
    }
    return ticks;
  }

  function logTicks(lo, hi) {
    var ticks = [];
    var a = Math.floor(Math.log10(lo)), b = Math.ceil(Math.log10(hi));
    var stride = Math.max(1, Math.ceil((b - a) / 6));
    for (var e = a; e <= b; e += stride) { var t = Math.pow(10, e); if (t >= lo && t <= hi) ticks.push(t); }
    if (ticks.length < 2) return niceTicks(lo, hi, 4).filter(function (v) { return v > 0; });
    return ticks;
  }

  function lowerBound(xs, x) {
    var lo = 0, hi = xs.length;
    while (lo < hi) { var mid = (lo + hi) >> 1; if (xs[mid] < x) lo = mid + 1; else hi = mid; }
    return lo;
  }

  function medianGap(xs) {
    if (xs.length < 3) return Infinity;
    var d = [];
    var stride = Math.max(1, Math.floor(xs.length / 2000));
    for (var i = stride; i < xs.length; i += stride) d.push(xs[i] - xs[i - stride]);
    d.sort(function (p, q) { return p - q; });
    return d[d.length >> 1] / stride;
  }

  /* One colour per metric (group); its attempts are shades of it: attempt 1 the colour
   * itself, later attempts alternately lighter and darker. */
  function shade(hex, attempt) {
    if (attempt <= 1) return hex;
    var n = parseInt(hex.slice(1), 16);
    var rgb = [(n >> 16) & 255, (n >> 8) & 255, n & 255];
    var k = Math.ceil((attempt - 1) / 2) * 0.28;
    var toward = attempt % 2 === 0 ? 255 : 0;
    return "#" + rgb.map(function (c) {
      var v = Math.round(c + (toward - c) * Math.min(0.75, k));
      return (v < 16 ? "0" : "") + v.toString(16);
    }).join("");
  }

  /* ---- the data uPlot draws -------------------------------------------------------------
   * uPlot wants one x array per chart: the union of every series' steps. A series has
   * `undefined` at the other series' steps (uPlot draws across those) and an explicit
   * `null` where its own readings are far apart (a gap in the log: the line breaks there,
   * as it should). On a log scale, values <= 0 cannot be drawn and are left out. */
  function align(spec, log) {
    var xs = [];
    var breaks = spec.series.map(function (s) {
      var out = [];
      if (s.kind === "points") return out;
      for (var i = 1; i < s.x.length; i++) {
        if (s.x[i] - s.x[i - 1] > s.gap) out.push((s.x[i] + s.x[i - 1]) / 2);
      }
      return out;
    });
    spec.series.forEach(function (s, k) {
      for (var i = 0; i < s.x.length; i++) xs.push(s.x[i]);
      for (var j = 0; j < breaks[k].length; j++) xs.push(breaks[k][j]);
    });
    xs = Float64Array.from(xs).sort();
    var ux = [];
    for (var u = 0; u < xs.length; u++) if (u === 0 || xs[u] !== xs[u - 1]) ux.push(xs[u]);
    var data = [ux];
    spec.series.forEach(function (s, k) {
      var ys = new Array(ux.length);
      for (var i = 0; i < s.x.length; i++) {
        var v = s.y[i];
        ys[lowerBound(ux, s.x[i])] = log && !(v > 0) ? undefined : v;
      }
      breaks[k].forEach(function (b) { ys[lowerBound(ux, b)] = null; });
      data.push(ys);
    });
    return data;
  }

  function positive(spec) {
    return spec.series.some(function (s) { return s.y.some(function (v) { return v > 0; }); });
  }

  /* ---- one chart ------------------------------------------------------------------------ */
  function Chart(spec) {
    var self = this;
    this.spec = spec;
    this.hidden = {};
    this.log = !!spec.log && positive(spec);
    this.markerHits = [];
    this.cursorStep = null;
    var groups = [];
    spec.series.forEach(function (s) {
      if (groups.indexOf(s.group) < 0) groups.push(s.group);
      var base = PALETTE[groups.indexOf(s.group) % PALETTE.length];
      s.color = s.key === "schedule" || s.kind === "reference" ? REFERENCE : shade(base, s.attempt);
      s.gap = medianGap(s.x) * 20;
    });

    var box = el("section", "chart");
    box.id = "chart-" + spec.id;
    box.dataset.chart = spec.id;
    box.dataset.series = spec.series.map(function (s) { return s.name; }).join("|");
    box.dataset.markers = String(spec.markers.length);
    box.dataset.rendered = "0";
    var head = el("div", "chart-head");
    head.appendChild(el("h3", null, spec.title));
    head.appendChild(el("span", "unit", spec.unit));
    this.box = box;
    document.getElementById("charts").appendChild(box);
    if (!spec.series.length) {
      box.appendChild(head);
      box.appendChild(el("div", "empty", spec.empty || "Not in this log."));
      box.dataset.rendered = "1";
      box.dataset.empty = "1";
      this.u = null;
      api.charts[spec.id] = { rendered: true, empty: true, series: [], markers: 0, lines: [], bands: 0 };
      return;
    }
    var scaleBtn = el("button", null, this.log ? "linear scale" : "log scale");
    scaleBtn.disabled = !positive(spec);
    scaleBtn.addEventListener("click", function () {
      self.log = !self.log;
      scaleBtn.textContent = self.log ? "linear scale" : "log scale";
      self.build();
    });
    var resetBtn = el("button", null, "reset zoom");
    resetBtn.addEventListener("click", function () { setView(full.slice()); });
    head.appendChild(scaleBtn);
    head.appendChild(resetBtn);
    box.appendChild(head);
    box.appendChild(this.legend());
    this.holder = el("div", "plot");
    this.holder.setAttribute("role", "img");
    this.holder.setAttribute("aria-label", spec.title);
    box.appendChild(this.holder);
    this.build();
  }

  Chart.prototype.legend = function () {
    var self = this, spec = this.spec;
    var legend = el("div", "legend");
    function item(color, text, title) {
      var node = el("span");
      var sw = el("i");
      sw.style.background = color;
      node.appendChild(sw);
      node.appendChild(document.createTextNode(text));
      if (title) node.title = title;
      legend.appendChild(node);
      return node;
    }
    spec.series.forEach(function (s, i) {
      var node = item(s.color, s.name, s.count + " logged values");
      node.dataset.series = s.name;
      node.addEventListener("click", function () {
        self.hidden[s.name] = !self.hidden[s.name];
        node.classList.toggle("off", !!self.hidden[s.name]);
        if (self.u) self.u.setSeries(i + 1, { show: !self.hidden[s.name] });
      });
    });
    spec.lines.forEach(function (l) { item("#444", l.name + " = " + fmt(l.y)); });
    spec.bands.forEach(function (b) { item("rgba(239, 108, 0, 0.5)", b.name); });
    if (spec.series.some(function (s) { return s.nonfinite.length; })) item(NONFINITE, "NaN / Inf");
    return legend;
  };

  /* The y range: the visible values and the reference lines, padded; never empty, so a
   * constant series (on a log scale too) and a single reading are drawn mid-chart. */
  Chart.prototype.yRange = function (u, lo, hi) {
    var log = this.log;
    function ok(v) { return typeof v === "number" && isFinite(v) && (!log || v > 0); }
    var a = ok(lo) ? lo : Infinity, b = ok(hi) ? hi : -Infinity;
    this.spec.lines.forEach(function (l) { if (ok(l.y)) { a = Math.min(a, l.y); b = Math.max(b, l.y); } });
    if (!(a <= b)) return log ? [0.1, 10] : [0, 1];
    if (log) {
      var pad = Math.max(1.25, Math.pow(b / a, 0.06));
      if (!isFinite(pad)) pad = 10;
      return [Math.max(a / pad, Number.MIN_VALUE), Math.min(b * pad, Number.MAX_VALUE)];
    }
    if (a === b) { var d = Math.abs(a) * 0.1 || 1; return [a - d, b + d]; }
    var p = (b - a) * 0.06;
    if (!isFinite(p)) p = 0;  // a span beyond the float range: draw it edge to edge
    return [a - p, b + p];
  };

  Chart.prototype.options = function (width) {
    var self = this, spec = this.spec;
    var series = [{ label: "step" }];
    spec.series.forEach(function (s) {
      var points = s.kind === "points";
      series.push({
        label: s.name,
        stroke: s.color,
        width: points ? 1.2 : 1.4,
        dash: s.kind === "reference" ? [5, 4] : undefined,
        show: !self.hidden[s.name],
        spanGaps: false,
        paths: points ? function () { return null; } : undefined,
        points: {
          size: points ? 6 : 4.5,
          fill: s.color,
          stroke: s.color,
          // dots: for point series, when few readings are in view, and for readings with
          // no neighbour close enough to draw a line to (a memory report logged once)
          show: function (u, si, i0, i1) { return points || self.visibleCount(si, i0, i1) <= 60; },
          filter: function (u, si, show) { return show ? null : self.lone[si]; }
        }
      });
    });
    return {
      width: width,
      height: HEIGHT,
      legend: { show: false },
      series: series,
      scales: {
        // uPlot passes every x range through here, a zoom's too: keep it, else all steps
        x: {
          time: false,
          range: function (u, lo, hi) {
            return typeof lo === "number" && typeof hi === "number" && hi > lo ? [lo, hi] : full.slice();
          }
        },
        y: { distr: this.log ? 3 : 1, log: 10, range: function (u, lo, hi) { return self.yRange(u, lo, hi); } }
      },
      axes: [
        {
          size: 32,
          splits: function (u, ai, lo, hi) { return niceTicks(lo, hi, Math.max(2, Math.floor(u.bbox.width / uPlot.pxRatio / 110))); },
          values: function (u, splits) { return splits.map(fmtStep); }
        },
        {
          size: Y_AXIS,
          // uPlot only draws an axis whose tick increment it finds in its own table,
          // which ends far short of 1e-30..1e30; the ticks are ours (splits), so one
          // increment spanning the axis lets it draw them at any range
          incrs: function (u, ai, lo, hi) { return [Math.max(5, hi - lo)]; },
          splits: function (u, ai, lo, hi) { return self.log ? logTicks(lo, hi) : niceTicks(lo, hi, 5); },
          // uPlot's log axes blank all but a few labels; ours are few already
          filter: function (u, splits) { return splits; },
          values: function (u, splits) { return splits.map(fmt); }
        }
      ],
      cursor: {
        sync: { key: SYNC, setSeries: false, scales: ["x", null] },
        y: false,  // a horizontal line means nothing on the other charts' scales
        drag: { x: true, y: false, setScale: true },
        // double-click resets every chart to all steps (below), not to this chart's data
        bind: { dblclick: function () { return function () { return null; }; } },
        points: { show: false }
      },
      hooks: {
        drawClear: [function (u) { self.drawBands(u); }],
        draw: [function (u) { self.drawOverlay(u); }],
        setCursor: [function (u) { self.onCursor(u); }],
        setScale: [function (u, key) { if (key === "x") onZoom(self); }]
      }
    };
  };

  Chart.prototype.build = function () {
    var self = this;
    if (this.u) this.u.destroy();
    this.data = align(this.spec, this.log);
    this.lone = [null].concat(this.data.slice(1).map(function (ys) {
      var out = [];
      for (var i = 0; i < ys.length; i++) {
        if (ys[i] === undefined || ys[i] === null) continue;
        var p = i - 1, n = i + 1;
        while (p >= 0 && ys[p] === undefined) p--;
        while (n < ys.length && ys[n] === undefined) n++;
        if ((p < 0 || ys[p] === null) && (n >= ys.length || ys[n] === null)) out.push(i);
      }
      return out;
    }));
    this.u = new uPlot(this.options(this.width()), this.data, this.holder);
    this.u.setScale("x", { min: view[0], max: view[1] });
    var over = this.u.over;
    var down = null;
    over.addEventListener("mouseenter", function () { active = self; });
    over.addEventListener("mouseleave", function () { if (active === self) active = null; hideTooltip(); });
    over.addEventListener("mousedown", function (ev) { down = ev.clientX; });
    over.addEventListener("dblclick", function () { setView(full.slice()); });
    over.addEventListener("click", function (ev) {
      if (down !== null && Math.abs(ev.clientX - down) > 5) return;  // the end of a drag-zoom
      var hit = self.markerAt(ev.clientX - over.getBoundingClientRect().left);
      if (hit !== null) showFinding(hit);
    });
  };

  Chart.prototype.width = function () {
    return Math.max(200, this.holder.clientWidth || this.box.clientWidth - 24);
  };

  Chart.prototype.visibleCount = function (si, i0, i1) {
    var ys = this.data[si], n = 0;
    for (var i = i0; i <= i1 && n <= 60; i++) if (ys[i] !== undefined && ys[i] !== null) n++;
    return n;
  };

  /* ---- overlays: bands below the curves; lines, NaN/Inf marks and findings above ---- */
  function plotClip(u) {
    var ctx = u.ctx, b = u.bbox;
    ctx.save();
    ctx.beginPath();
    ctx.rect(b.left, b.top, b.width, b.height);
    ctx.clip();
    return ctx;
  }

  Chart.prototype.drawBands = function (u) {
    var ctx = plotClip(u), b = u.bbox;
    var px = uPlot.pxRatio;
    if (causeSpan) {
      var c0 = u.valToPos(causeSpan[0], "x", true), c1 = u.valToPos(causeSpan[1], "x", true);
      ctx.fillStyle = CAUSE;
      ctx.fillRect(c0 - px, b.top, Math.max(2 * px, c1 - c0 + 2 * px), b.height);
    }
    ctx.fillStyle = BAND;
    this.spec.bands.forEach(function (band) {
      band.ranges.forEach(function (r) {
        if (r[1] < u.scales.x.min || r[0] > u.scales.x.max) return;
        var a = u.valToPos(r[0], "x", true), z = u.valToPos(r[1], "x", true);
        ctx.fillRect(a - px, b.top, Math.max(2 * px, z - a + 2 * px), b.height);
      });
    });
    ctx.restore();
  };

  Chart.prototype.drawOverlay = function (u) {
    var self = this, ctx = plotClip(u), b = u.bbox, px = uPlot.pxRatio, log = this.log;
    var x0 = u.scales.x.min, x1 = u.scales.x.max;

    ctx.setLineDash([6 * px, 4 * px]);
    ctx.strokeStyle = "#444";
    ctx.fillStyle = "#444";
    ctx.lineWidth = px;
    ctx.font = 11 * px + "px system-ui, sans-serif";
    ctx.textAlign = "right";
    ctx.textBaseline = "bottom";
    this.spec.lines.forEach(function (l) {
      if (log && !(l.y > 0)) return;
      var y = Math.round(u.valToPos(l.y, "y", true)) + 0.5;
      ctx.beginPath(); ctx.moveTo(b.left, y); ctx.lineTo(b.left + b.width, y); ctx.stroke();
      ctx.fillText(l.name, b.left + b.width - 4 * px, y - 2 * px);
    });
    ctx.setLineDash([]);

    // non-finite values: red ticks along the top edge
    var drawn = {};
    ctx.fillStyle = NONFINITE;
    this.spec.series.forEach(function (s, k) {
      var n = 0;
      if (!self.hidden[s.name]) {
        var ys = self.data[k + 1];
        var i0 = lowerBound(self.data[0], x0), i1 = lowerBound(self.data[0], x1);
        for (var i = i0; i < i1 && i < ys.length; i++) if (ys[i] !== undefined && ys[i] !== null) n++;
        s.nonfinite.forEach(function (r) {
          if (r[1] < x0 || r[0] > x1) return;
          var p = u.valToPos(r[0], "x", true), q = u.valToPos(r[1], "x", true);
          ctx.fillRect(p - 1.5 * px, b.top, Math.max(3 * px, q - p + 3 * px), 7 * px);
          n++;
        });
      }
      drawn[s.name] = n;
    });

    // finding markers: a line where it fired and a triangle on the top edge
    this.markerHits = [];
    this.spec.markers.forEach(function (idx) {
      var f = DATA.findings[idx];
      if (typeof f.step !== "number" || f.step < x0 || f.step > x1) return;
      var x = Math.round(u.valToPos(f.step, "x", true)) + 0.5;
      var color = SEVERITY[f.severity] || SEVERITY.info;
      ctx.strokeStyle = color;
      ctx.globalAlpha = 0.55;
      ctx.beginPath(); ctx.moveTo(x, b.top); ctx.lineTo(x, b.top + b.height); ctx.stroke();
      ctx.globalAlpha = 1;
      ctx.fillStyle = color;
      ctx.beginPath();
      ctx.moveTo(x - 6 * px, b.top); ctx.lineTo(x + 6 * px, b.top); ctx.lineTo(x, b.top + 9 * px);
      ctx.closePath(); ctx.fill();
      self.markerHits.push({ x: u.valToPos(f.step, "x"), idx: idx });
    });
    // the diagnosed cause's evidence: diamonds on the bottom edge
    var evidenceDrawn = 0;
    ctx.fillStyle = CAUSE_MARK;
    causeSteps.forEach(function (step) {
      if (step < x0 || step > x1) return;
      var x = u.valToPos(step, "x", true), y = b.top + b.height - 6 * px;
      ctx.beginPath();
      ctx.moveTo(x, y - 5 * px); ctx.lineTo(x + 5 * px, y); ctx.lineTo(x, y + 5 * px); ctx.lineTo(x - 5 * px, y);
      ctx.closePath(); ctx.fill();
      evidenceDrawn++;
    });
    this.evidenceDrawn = evidenceDrawn;
    ctx.restore();
    this.drawn = drawn;
    this.box.dataset.rendered = "1";
    this.report(u);
  };

  // called from uPlot's draw hook, the first time from inside its constructor: use `u`
  Chart.prototype.report = function (u) {
    var self = this;
    api.charts[this.spec.id] = {
      rendered: true,
      empty: false,
      log: this.log,
      view: [u.scales.x.min, u.scales.x.max],
      cursorStep: this.cursorStep,
      series: this.spec.series.map(function (s) {
        return {
          name: s.name, group: s.group, attempt: s.attempt, kind: s.kind, color: s.color,
          points: s.x.length, nonfinite: s.nonfinite.length,
          drawn: (self.drawn && self.drawn[s.name]) || 0, visible: !self.hidden[s.name]
        };
      }),
      markers: this.markerHits.length,
      evidence: this.evidenceDrawn || 0,
      markerSteps: this.markerHits.map(function (m) { return DATA.findings[m.idx].step; }),
      lines: this.spec.lines.map(function (l) { return l.name; }),
      bands: this.spec.bands.reduce(function (n, band) { return n + band.ranges.length; }, 0),
      // the tick labels uPlot drew on each axis (its own record of them)
      xTicks: (u.axes[0]._values || []).slice(),
      yTicks: (u.axes[1]._values || []).slice(),
      plot: { left: u.bbox.left, top: u.bbox.top, width: u.bbox.width, height: u.bbox.height }
    };
  };

  /* ---- hover: every chart's cursor follows (uPlot sync); the hovered one explains ---- */
  Chart.prototype.onCursor = function (u) {
    var left = u.cursor.left;
    this.cursorStep = left === undefined || left === null || left < 0 ? null : u.posToVal(left, "x");
    if (api.charts[this.spec.id]) api.charts[this.spec.id].cursorStep = this.cursorStep;
    if (active === this) {
      if (this.cursorStep === null) hideTooltip();
      else showTooltip(this, left, u.cursor.top);
    }
  };

  Chart.prototype.valuesAt = function (step) {
    var self = this, out = [];
    this.spec.series.forEach(function (s) {
      if (self.hidden[s.name]) return;
      s.nonfinite.forEach(function (r) {
        if (step >= r[0] - 0.5 && step <= r[1] + 0.5) out.push({ name: s.name, value: NaN });
      });
      if (!s.x.length) return;
      var i = lowerBound(s.x, step);
      var best = i < s.x.length ? i : s.x.length - 1;
      if (i > 0 && (i >= s.x.length || step - s.x[i - 1] < s.x[i] - step)) best = i - 1;
      if (s.x[best] < full[0] || Math.abs(s.x[best] - step) > Math.max(s.gap, (view[1] - view[0]) / 20)) return;
      out.push({ name: s.name, step: s.x[best], value: s.y[best] });
    });
    return out;
  };

  Chart.prototype.markerAt = function (x) {
    var best = null, dist = 6;
    this.markerHits.forEach(function (m) {
      var d = Math.abs(m.x - x);
      if (d <= dist) { dist = d; best = m.idx; }
    });
    return best;
  };

  var tooltip = document.getElementById("tooltip");

  function hideTooltip() { tooltip.hidden = true; }

  function showTooltip(chart, left, top) {
    var step = chart.cursorStep;
    while (tooltip.firstChild) tooltip.removeChild(tooltip.firstChild);
    tooltip.appendChild(el("div", null, "step " + fmtStep(step)));
    chart.valuesAt(step).forEach(function (v) {
      tooltip.appendChild(el("div", null, v.name + ": " + fmt(v.value) + (isFinite(v.value) ? " (step " + fmtStep(v.step) + ")" : "")));
    });
    var hit = chart.markerAt(left);
    if (hit !== null) {
      var f = DATA.findings[hit];
      tooltip.appendChild(el("div", "f", f.code + " " + f.severity + " (" + findingStep(f) + "): " + f.title));
      if (f.fix) tooltip.appendChild(el("div", "f", "Fix: " + f.fix));
      tooltip.appendChild(el("div", "f muted", "click to read the finding"));
    }
    tooltip.hidden = false;
    var r = chart.u.over.getBoundingClientRect();
    var cx = r.left + left, cy = r.top + top;
    var x = cx + 14, y = cy + 12;
    var w = tooltip.offsetWidth, h = tooltip.offsetHeight;
    if (x + w > window.innerWidth - 8) x = cx - w - 14;
    if (y + h > window.innerHeight - 8) y = cy - h - 12;
    tooltip.style.left = x + "px";
    tooltip.style.top = y + "px";
  }

  /* ---- zoom: whatever set one chart's step range sets every chart's ------------------ */
  function onZoom(source) {
    if (syncing || !source.u) return;
    var sc = source.u.scales.x;
    if (typeof sc.min !== "number" || typeof sc.max !== "number") return;
    view = [sc.min, sc.max];
    syncing = true;
    try {
      charts.forEach(function (c) {
        if (c !== source && c.u && (c.u.scales.x.min !== view[0] || c.u.scales.x.max !== view[1])) {
          c.u.setScale("x", { min: view[0], max: view[1] });
        }
      });
    } finally {
      syncing = false;
    }
  }

  function setView(range) {
    var lo = Math.max(full[0], range[0]), hi = Math.min(full[1], range[1]);
    if (!(hi > lo)) { lo = full[0]; hi = full[1]; }
    view = [lo, hi];
    syncing = true;
    try {
      charts.forEach(function (c) { c.u.setScale("x", { min: lo, max: hi }); });
    } finally {
      syncing = false;
    }
  }

  /* ---- findings list -------------------------------------------------------------------- */
  function findingCard(f, idx, withStep) {
    var li = el("li", "finding " + f.severity);
    li.id = "finding-" + idx;
    li.dataset.code = f.code;
    li.dataset.severity = f.severity;
    if (typeof f.step === "number") li.dataset.step = String(f.step);
    var head = el("div", "head");
    head.appendChild(el("span", "code", f.code));
    head.appendChild(el("span", "sev", f.severity));
    head.appendChild(el("span", "title", f.title));
    if (withStep && typeof f.step === "number") {
      var st = el("span", "step");
      var a = el("a", null, findingStep(f) + " — show on the curves");
      a.addEventListener("click", function () {
        var w = Math.max(20, (full[1] - full[0]) * 0.04);
        setView([f.step - w, f.step + w]);
        document.getElementById("charts").scrollIntoView({ behavior: "smooth" });
      });
      st.appendChild(a);
      head.appendChild(st);
    }
    li.appendChild(head);
    li.appendChild(el("div", "msg", f.message));
    var fix = el("div", "fix");
    fix.appendChild(el("strong", null, "Fix: "));
    fix.appendChild(document.createTextNode(f.fix));
    li.appendChild(fix);
    if (f.why || f.signs || f.defuse) {
      var det = el("details");
      det.appendChild(el("summary", null, "Why it explodes · early signs · how to defuse" + (f.seed ? " (seed " + f.seed + ")" : "")));
      [["Why it explodes", f.why], ["Early signs", f.signs], ["How to defuse", f.defuse]].forEach(function (part) {
        if (!part[1]) return;
        det.appendChild(el("h4", null, part[0]));
        det.appendChild(el("p", null, part[1]));
      });
      li.appendChild(det);
    }
    return li;
  }

  function showFinding(idx) {
    var li = document.getElementById("finding-" + idx);
    if (!li) return;
    li.hidden = false;
    li.scrollIntoView({ behavior: "smooth", block: "center" });
    li.classList.add("flash");
    setTimeout(function () { li.classList.remove("flash"); }, 1600);
  }

  function renderFindings() {
    var list = document.getElementById("finding-list");
    if (!DATA.findings.length) {
      list.appendChild(el("li", "muted", "No findings: the detectors saw nothing wrong in this log."));
      return;
    }
    DATA.findings.forEach(function (f, i) { list.appendChild(findingCard(f, i, true)); });
    var filters = document.getElementById("filters");
    var current = "all";
    ["all", "error", "warning", "info"].forEach(function (sev) {
      var n = sev === "all" ? DATA.findings.length : DATA.findings.filter(function (f) { return f.severity === sev; }).length;
      if (sev !== "all" && !n) return;
      var btn = el("button", sev === "all" ? "on" : null, sev + " (" + n + ")");
      btn.addEventListener("click", function () {
        current = sev;
        Array.prototype.forEach.call(filters.children, function (c) { c.classList.remove("on"); });
        btn.classList.add("on");
        Array.prototype.forEach.call(list.children, function (li) {
          li.hidden = current !== "all" && li.dataset.severity !== current;
        });
      });
      filters.appendChild(btn);
    });
  }

  function renderHeader() {
    var s = DATA.source;
    var parts = [s.path, s.format + " log", fmtStep(s.records) + " records"];
    if (typeof s.first_step === "number") parts.push("steps " + fmtStep(s.first_step) + "–" + fmtStep(s.last_step));
    if (s.interval) parts.push("logged every " + fmtStep(s.interval) + " step" + (s.interval === 1 ? "" : "s"));
    if (DATA.attempts && DATA.attempts.length) {
      parts.push(DATA.attempts.length + " attempts (restarts at step " + DATA.attempts.slice(1).map(function (a) { return fmtStep(a.first_step); }).join(", ") + ")");
    }
    if (DATA.decimated) parts.push("curves decimated to the min and max of each bucket");
    parts.push("generated " + DATA.generated);
    document.getElementById("source").textContent = parts.join(" · ");
    var counts = document.getElementById("counts");
    var c = DATA.counts;
    if (!c.error && !c.warning && !c.info) counts.appendChild(el("span", "count ok", "no findings"));
    ["error", "warning", "info"].forEach(function (sev) {
      if (c[sev]) counts.appendChild(el("span", "count " + sev, c[sev] + " " + sev + (c[sev] === 1 ? "" : "s")));
    });
  }

  function renderChecklist() {
    var cl = DATA.checklist;
    if (!cl) return;
    document.getElementById("checklist-section").hidden = false;
    document.getElementById("toc-checklist").hidden = false;
    document.getElementById("plan-facts").textContent = cl.facts;
    var body = document.querySelector("#checklist-table tbody");
    cl.items.forEach(function (item) {
      var tr = el("tr");
      tr.dataset.item = item.item;
      tr.appendChild(el("td", null, item.item));
      tr.appendChild(el("td", "status-" + item.status, item.status.toUpperCase()));
      tr.appendChild(el("td", null, String(item.findings)));
      body.appendChild(tr);
    });
    var list = document.getElementById("checklist-findings");
    cl.findings.forEach(function (f, i) { list.appendChild(findingCard(f, "plan-" + i, false)); });
  }

  function stepText(e) {
    if (typeof e.step !== "number") return "config";
    return typeof e.began === "number" && e.began !== e.step
      ? "steps " + fmtStep(e.began) + "–" + fmtStep(e.step) : "step " + fmtStep(e.step);
  }

  function renderDiagnosis() {
    if (!cause) return;
    document.getElementById("diagnosis-section").hidden = false;
    document.getElementById("toc-diagnosis").hidden = false;
    var box = document.getElementById("diagnosis-cause");
    box.dataset.cause = cause.cause;
    var head = cause.cause === "unknown" ? "Cause unknown: " + cause.title
      : "Cause: " + cause.title;
    box.appendChild(el("div", "cause", head));
    var meta = [cause.check];
    if (typeof cause.confidence === "number") meta.push("confidence " + cause.confidence.toFixed(2));
    if (typeof cause.first_step === "number") meta.push("evidence begins at step " + fmtStep(cause.first_step));
    if (cause.steps_before_symptom) meta.push(fmtStep(cause.steps_before_symptom) + " steps before the first symptom");
    box.appendChild(el("div", "meta", meta.join(" · ")));
    (cause.notes || []).forEach(function (n) { box.appendChild(el("div", "meta", n)); });
    var fix = el("div");
    fix.appendChild(el("strong", null, cause.cause === "unknown" ? "Next: " : "Fix: "));
    fix.appendChild(document.createTextNode(cause.fix));
    box.appendChild(fix);
    if (cause.cause !== "unknown") {
      var confirm = el("div");
      confirm.appendChild(el("strong", null, "To confirm: "));
      confirm.appendChild(document.createTextNode(cause.next_test));
      box.appendChild(confirm);
    }
    var list = document.getElementById("diagnosis-timeline");
    cause.evidence.forEach(function (e) {
      var li = el("li", e.role === "sign" ? "sign" : "symptom");
      li.dataset.code = e.code;
      var when = el("span", "when");
      if (typeof e.step === "number") {
        var a = el("a", null, stepText(e));
        a.addEventListener("click", function () {
          var lo = typeof e.began === "number" ? e.began : e.step;
          var w = Math.max(20, (full[1] - full[0]) * 0.04);
          setView([lo - w, e.step + w]);
          document.getElementById("charts").scrollIntoView({ behavior: "smooth" });
        });
        when.appendChild(a);
      } else {
        when.textContent = stepText(e);
      }
      li.appendChild(when);
      li.appendChild(el("span", "code", e.code));
      li.appendChild(el("span", "role", e.role || "symptom"));
      li.appendChild(el("span", "msg", e.message));
      list.appendChild(li);
    });
    var others = (diagnosis.considered || []).concat(cause.candidates || []);
    if (others.length) {
      document.getElementById("diagnosis-considered").textContent = "Also considered: " +
        others.map(function (c) { return c.cause + " (" + c.confidence.toFixed(2) + ")"; }).join(", ");
    }
  }

  /* ---- the checkpoint (sapper report --checkpoint): per layer, on a layer axis of its
   * own (static SVG: the curves above share the step axis, a layer is not a step) ---- */
  var SVGNS = "http://www.w3.org/2000/svg";

  function svgEl(tag, attrs, text) {
    var node = document.createElementNS(SVGNS, tag);
    Object.keys(attrs).forEach(function (k) { node.setAttribute(k, String(attrs[k])); });
    if (text !== undefined) node.textContent = String(text);
    return node;
  }

  function layerChart(title, layers, key, log) {
    var W = 640, H = 190, L = 64, R = 12, T = 10, B = 30;
    var pts = layers.filter(function (r) { return typeof r[key] === "number" && isFinite(r[key]) && (!log || r[key] > 0); });
    var box = el("div", "layer-chart");
    box.dataset.metric = key;
    box.appendChild(el("h3", null, title));
    var svg = svgEl("svg", { viewBox: "0 0 " + W + " " + H, role: "img", "aria-label": title });
    box.appendChild(svg);
    if (!layers.length) return box;
    var x0 = layers[0].layer, x1 = layers[layers.length - 1].layer;
    var vals = pts.map(function (r) { return log ? Math.log10(r[key]) : r[key]; });
    var lo = vals.length ? Math.min.apply(null, vals) : 0, hi = vals.length ? Math.max.apply(null, vals) : 1;
    if (!log) lo = Math.min(lo, 0);
    if (hi - lo < 1e-12) { hi += log ? 0.5 : Math.abs(hi) * 0.1 || 1; lo -= log ? 0.5 : 0; }
    function X(layer) { return L + (x1 > x0 ? (layer - x0) / (x1 - x0) : 0.5) * (W - L - R); }
    function Y(v) { return T + (1 - (v - lo) / (hi - lo)) * (H - T - B); }
    svg.appendChild(svgEl("line", { x1: L, y1: H - B, x2: W - R, y2: H - B, stroke: "#999" }));
    svg.appendChild(svgEl("line", { x1: L, y1: T, x2: L, y2: H - B, stroke: "#999" }));
    [lo, hi].forEach(function (v) {
      svg.appendChild(svgEl("text", { x: L - 6, y: Y(v) + 4, "text-anchor": "end" }, fmt(log ? Math.pow(10, v) : v)));
    });
    var mid = Math.round((x0 + x1) / 2);
    var ticks = x1 - x0 >= 2 ? [x0, mid, x1] : x1 > x0 ? [x0, x1] : [x0];
    ticks.forEach(function (t, i) {
      var anchor = ticks.length === 1 ? "middle" : i === 0 ? "start" : i === ticks.length - 1 ? "end" : "middle";
      svg.appendChild(svgEl("text", { x: X(t), y: H - B + 16, "text-anchor": anchor }, "layer " + t));
    });
    if (pts.length > 1) {
      svg.appendChild(svgEl("polyline", {
        points: pts.map(function (r, i) { return X(r.layer) + "," + Y(vals[i]); }).join(" "),
        fill: "none", stroke: PALETTE[0], "stroke-width": 1.5
      }));
    }
    pts.forEach(function (r, i) {
      var dot = svgEl("circle", { cx: X(r.layer), cy: Y(vals[i]), r: r.findings ? 4 : 2.5,
        fill: r.findings ? SEVERITY.warning : PALETTE[0] });
      dot.appendChild(svgEl("title", {}, "layer " + r.layer + ": " + fmt(r[key]) + (r.findings ? " · " + r.findings + " finding(s)" : "")));
      svg.appendChild(dot);
    });
    layers.forEach(function (r) {  // a layer with NaN/Inf: a red mark on the axis
      if (!r.nonfinite) return;
      var mark = svgEl("rect", { x: X(r.layer) - 3, y: T, width: 6, height: H - T - B, fill: NONFINITE, opacity: 0.35 });
      mark.appendChild(svgEl("title", {}, "layer " + r.layer + ": " + r.nonfinite + " non-finite value(s)"));
      svg.appendChild(mark);
    });
    return box;
  }

  function renderCheckpoint() {
    var ck = DATA.checkpoint;
    if (!ck) return;
    document.getElementById("checkpoint-section").hidden = false;
    document.getElementById("toc-checkpoint").hidden = false;
    var steps = Object.keys(ck.steps || {}).map(function (k) { return k + " step " + fmt(ck.steps[k]); });
    document.getElementById("checkpoint-source").textContent = [ck.path, ck.format,
      fmtStep(ck.parameters) + " values"].concat(steps).join(" · ");
    var holder = document.getElementById("checkpoint-charts");
    var drawn = 0;
    [["Weight RMS per layer", "rms", true],
     ["Largest update the saved Adam moments imply, |m̂|/(√v̂+ε), in learning rates", "max_update", true]]
      .forEach(function (c) {
        if (!ck.layers.some(function (r) { return typeof r[c[1]] === "number"; })) return;
        holder.appendChild(layerChart(c[0], ck.layers, c[1], c[2]));
        drawn++;
      });
    if (!ck.layers.length) holder.appendChild(el("p", "muted", "No per-layer tensors in this checkpoint (no layer index in its names)."));
    var list = document.getElementById("checkpoint-findings");
    if (!ck.findings.length) list.appendChild(el("li", "muted", "No findings in the checkpoint."));
    ck.findings.forEach(function (f, i) { list.appendChild(findingCard(f, "ckpt-" + i, false)); });
    api.checkpoint = { layers: ck.layers.length, charts: drawn, findings: ck.findings.length };
  }

  function renderNotes() {
    if (!DATA.notes.length) return;
    document.getElementById("notes-section").hidden = false;
    document.getElementById("toc-notes").hidden = false;
    var ul = document.getElementById("note-list");
    DATA.notes.forEach(function (n) { ul.appendChild(el("li", null, n)); });
  }

  try {
    if (typeof uPlot !== "function") throw new Error("the charting library (uPlot) is missing from the page");
    renderHeader();
    renderDiagnosis();
    DATA.charts.forEach(function (spec) {
      var c = new Chart(spec);
      if (c.u) charts.push(c);
    });
    renderFindings();
    renderCheckpoint();
    renderChecklist();
    renderNotes();
    var pending = null;
    window.addEventListener("resize", function () {
      if (pending) cancelAnimationFrame(pending);
      pending = requestAnimationFrame(function () {
        charts.forEach(function (c) { c.u.setSize({ width: c.width(), height: HEIGHT }); });
      });
    });
    api.setView = setView;
    api.reset = function () { setView(full.slice()); };
    api.fullRange = full.slice();
    api.findings = DATA.findings.length;
    api.diagnosis = cause ? { cause: cause.cause, span: causeSpan, evidence: causeSteps.length } : null;
    api.uplot = uPlot;
    api.plot = function (id) {
      for (var i = 0; i < charts.length; i++) if (charts[i].spec.id === id) return charts[i].u;
      return null;
    };
    api.renderedAt = performance.now();  // ms since navigation start: the time to open
    api.ready = true;
    document.body.dataset.ready = "1";
  } catch (err) {
    api.errors.push(String(err && err.stack || err));
    console.error("sapper report failed to render:", err);
  }
})();
