/* sapper run report: draws the curves on canvas, marks findings, lists them.
 * Self-contained: no library, no network. Every text that came from a log is put in the
 * page with textContent (never innerHTML), so a log line cannot inject markup.
 * window.sapperReport exposes what was drawn, for tests and for the curious. */
(function () {
  "use strict";

  var api = (window.sapperReport = { ready: false, charts: {}, errors: [] });
  var DATA = JSON.parse(document.getElementById("sapper-data").textContent);
  var PALETTE = ["#1565c0", "#ef6c00", "#2e7d32", "#6a1b9a", "#00838f", "#ad1457", "#4e342e"];
  var SEVERITY = { error: "#c62828", warning: "#d08400", info: "#1565c0" };
  var NONFINITE = "rgba(198, 40, 40, 0.85)";
  var BAND = "rgba(239, 108, 0, 0.16)";
  var M = { left: 66, right: 18, top: 16, bottom: 26 };
  var charts = [];
  var full = fullRange();
  var view = full.slice();

  function el(tag, cls, text) {
    var node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  function fmt(v) {
    if (v === null || v === undefined) return "N/A";
    if (!isFinite(v)) return String(v);
    var a = Math.abs(v);
    if (a !== 0 && (a < 1e-3 || a >= 1e5)) return v.toExponential(2);
    return String(+v.toPrecision(4));
  }

  function fmtStep(v) {
    return Math.round(v).toLocaleString("en-US");
  }

  function fullRange() {
    var lo = Infinity, hi = -Infinity;
    DATA.charts.forEach(function (c) {
      c.series.forEach(function (s) {
        if (s.x.length) { lo = Math.min(lo, s.x[0]); hi = Math.max(hi, s.x[s.x.length - 1]); }
        s.nonfinite.forEach(function (r) { lo = Math.min(lo, r[0]); hi = Math.max(hi, r[1]); });
      });
    });
    if (DATA.source && DATA.source.first_step !== null && DATA.source.first_step !== undefined) {
      lo = Math.min(lo, DATA.source.first_step); hi = Math.max(hi, DATA.source.last_step);
    }
    if (!isFinite(lo)) { lo = 0; hi = 1; }
    if (hi === lo) { hi = lo + 1; }
    var pad = (hi - lo) * 0.01;  // a reading on the first or last step stays visible
    return [lo - pad, hi + pad];
  }

  /* ---- axes ------------------------------------------------------------------------ */
  function niceTicks(lo, hi, count) {
    var span = hi - lo;
    if (!(span > 0)) return [lo];
    var step = Math.pow(10, Math.floor(Math.log10(span / count)));
    var err = span / count / step;
    if (err >= 7.5) step *= 10; else if (err >= 3.5) step *= 5; else if (err >= 1.5) step *= 2;
    var ticks = [];
    for (var t = Math.ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) ticks.push(+t.toPrecision(12));
    return ticks;
  }

  function logTicks(lo, hi) {
    var ticks = [];
    var a = Math.floor(Math.log10(lo)), b = Math.ceil(Math.log10(hi));
    var stride = Math.max(1, Math.ceil((b - a) / 6));
    for (var e = a; e <= b; e += stride) { var t = Math.pow(10, e); if (t >= lo && t <= hi) ticks.push(t); }
    if (ticks.length < 2) return niceTicks(lo, hi, 4);
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

  /* ---- one chart ------------------------------------------------------------------- */
  function Chart(spec, index) {
    var self = this;
    this.spec = spec;
    this.hidden = {};
    this.logScale = !!spec.log;
    this.markerHits = [];
    this.hoverStep = null;
    this.drag = null;
    spec.series.forEach(function (s, i) {
      s.color = s.key === "schedule" || s.kind === "reference" ? "#7b8794" : PALETTE[i % PALETTE.length];
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
    if (!spec.series.length) {
      box.appendChild(head);
      box.appendChild(el("div", "empty", spec.empty || "Not in this log."));
      box.dataset.rendered = "1";
      box.dataset.empty = "1";
      document.getElementById("charts").appendChild(box);
      this.canvas = null;
      api.charts[spec.id] = { rendered: true, empty: true, series: [], markers: 0, lines: [], bands: 0 };
      return;
    }
    var scaleBtn = el("button", null, this.logScale ? "linear scale" : "log scale");
    scaleBtn.addEventListener("click", function () {
      self.logScale = !self.logScale;
      scaleBtn.textContent = self.logScale ? "linear scale" : "log scale";
      self.draw();
    });
    var resetBtn = el("button", null, "reset zoom");
    resetBtn.addEventListener("click", function () { setView(full.slice()); });
    head.appendChild(scaleBtn);
    head.appendChild(resetBtn);
    box.appendChild(head);

    var legend = el("div", "legend");
    spec.series.forEach(function (s) {
      var item = el("span");
      var sw = el("i");
      sw.style.background = s.color;
      item.appendChild(sw);
      item.appendChild(document.createTextNode(s.name));
      item.title = s.count + " logged values";
      item.addEventListener("click", function () {
        self.hidden[s.name] = !self.hidden[s.name];
        item.classList.toggle("off", !!self.hidden[s.name]);
        self.draw();
      });
      legend.appendChild(item);
    });
    spec.lines.forEach(function (l) {
      var item = el("span");
      var sw = el("i");
      sw.style.background = "#444";
      item.appendChild(sw);
      item.appendChild(document.createTextNode(l.name + " = " + fmt(l.y)));
      legend.appendChild(item);
    });
    spec.bands.forEach(function (b) {
      var item = el("span");
      var sw = el("i");
      sw.style.background = "rgba(239, 108, 0, 0.5)";
      item.appendChild(sw);
      item.appendChild(document.createTextNode(b.name));
      legend.appendChild(item);
    });
    if (spec.series.some(function (s) { return s.nonfinite.length; })) {
      var nf = el("span");
      var sw2 = el("i");
      sw2.style.background = NONFINITE;
      nf.appendChild(sw2);
      nf.appendChild(document.createTextNode("NaN / Inf"));
      legend.appendChild(nf);
    }
    box.appendChild(legend);
    this.canvas = el("canvas");
    this.canvas.setAttribute("role", "img");
    this.canvas.setAttribute("aria-label", spec.title);
    box.appendChild(this.canvas);
    document.getElementById("charts").appendChild(box);
    this.bindMouse();
  }

  Chart.prototype.plotBox = function () {
    var w = this.canvas.clientWidth, h = this.canvas.clientHeight;
    return { x: M.left, y: M.top, w: Math.max(10, w - M.left - M.right), h: Math.max(10, h - M.top - M.bottom), cw: w, ch: h };
  };

  Chart.prototype.sx = function (step, b) {
    return b.x + ((step - view[0]) / (view[1] - view[0])) * b.w;
  };

  Chart.prototype.stepAt = function (px, b) {
    return view[0] + ((px - b.x) / b.w) * (view[1] - view[0]);
  };

  Chart.prototype.yDomain = function () {
    var lo = Infinity, hi = -Infinity, self = this, log = this.logScale;
    function take(v) {
      if (!isFinite(v) || (log && v <= 0)) return;
      if (v < lo) lo = v;
      if (v > hi) hi = v;
    }
    this.spec.series.forEach(function (s) {
      if (self.hidden[s.name]) return;
      var a = Math.max(0, lowerBound(s.x, view[0]) - 1), z = Math.min(s.x.length, lowerBound(s.x, view[1]) + 1);
      for (var i = a; i < z; i++) take(s.y[i]);
    });
    this.spec.lines.forEach(function (l) { take(l.y); });
    if (!isFinite(lo)) {
      if (log) { this.logScale = false; return this.yDomain(); }
      return [0, 1];
    }
    if (log) {
      var pad = Math.pow(hi / lo, 0.05) || 1.1;
      return [lo / pad, hi * pad];
    }
    if (hi === lo) { var d = Math.abs(hi) * 0.1 || 1; return [lo - d, hi + d]; }
    var p = (hi - lo) * 0.06;
    return [lo - p, hi + p];
  };

  Chart.prototype.draw = function () {
    if (!this.canvas) return;
    var dpr = window.devicePixelRatio || 1;
    var b = this.plotBox();
    this.canvas.width = Math.round(b.cw * dpr);
    this.canvas.height = Math.round(b.ch * dpr);
    var g = this.canvas.getContext("2d");
    g.setTransform(dpr, 0, 0, dpr, 0, 0);
    g.clearRect(0, 0, b.cw, b.ch);
    var dom = this.yDomain();
    var log = this.logScale;
    var y0 = log ? Math.log10(dom[0]) : dom[0], y1 = log ? Math.log10(dom[1]) : dom[1];
    function sy(v) {
      var t = log ? Math.log10(v) : v;
      return b.y + b.h - ((t - y0) / (y1 - y0)) * b.h;
    }
    this.sy = sy;
    var self = this;

    // grid and axes
    g.font = "11px system-ui, sans-serif";
    g.strokeStyle = "#e6e9ed";
    g.fillStyle = "#5b6570";
    g.lineWidth = 1;
    var yt = log ? logTicks(dom[0], dom[1]) : niceTicks(dom[0], dom[1], 5);
    g.textAlign = "right";
    g.textBaseline = "middle";
    yt.forEach(function (t) {
      var y = Math.round(sy(t)) + 0.5;
      if (y < b.y - 1 || y > b.y + b.h + 1) return;
      g.beginPath(); g.moveTo(b.x, y); g.lineTo(b.x + b.w, y); g.stroke();
      g.fillText(fmt(t), b.x - 6, y);
    });
    var xt = niceTicks(view[0], view[1], Math.max(2, Math.floor(b.w / 110)));
    g.textAlign = "center";
    g.textBaseline = "top";
    xt.forEach(function (t) {
      var x = Math.round(self.sx(t, b)) + 0.5;
      if (x < b.x - 1 || x > b.x + b.w + 1) return;
      g.beginPath(); g.moveTo(x, b.y); g.lineTo(x, b.y + b.h); g.stroke();
      g.fillText(fmtStep(t), x, b.y + b.h + 6);
    });
    g.strokeStyle = "#9aa4ae";
    g.strokeRect(b.x + 0.5, b.y + 0.5, b.w, b.h);

    g.save();
    g.beginPath(); g.rect(b.x, b.y, b.w, b.h); g.clip();

    // shaded step bands (skipped steps)
    g.fillStyle = BAND;
    this.spec.bands.forEach(function (band) {
      band.ranges.forEach(function (r) {
        if (r[1] < view[0] || r[0] > view[1]) return;
        var a = self.sx(r[0], b), z = self.sx(r[1], b);
        g.fillRect(a - 1, b.y, Math.max(2, z - a + 2), b.h);
      });
    });

    // reference lines
    g.setLineDash([6, 4]);
    g.strokeStyle = "#444";
    g.fillStyle = "#444";
    g.textAlign = "right";
    g.textBaseline = "bottom";
    this.spec.lines.forEach(function (l) {
      if (log && l.y <= 0) return;
      var y = Math.round(sy(l.y)) + 0.5;
      g.beginPath(); g.moveTo(b.x, y); g.lineTo(b.x + b.w, y); g.stroke();
      g.fillText(l.name, b.x + b.w - 4, y - 2);
    });
    g.setLineDash([]);

    // series
    var drawn = {};
    this.spec.series.forEach(function (s) {
      if (self.hidden[s.name]) { drawn[s.name] = 0; return; }
      var a = Math.max(0, lowerBound(s.x, view[0]) - 1), z = Math.min(s.x.length, lowerBound(s.x, view[1]) + 1);
      g.strokeStyle = s.color;
      g.fillStyle = s.color;
      g.lineWidth = s.kind === "points" ? 1.2 : 1.4;
      if (s.kind === "reference") g.setLineDash([5, 4]);
      g.beginPath();
      var pen = false, n = 0, prev = null;
      for (var i = a; i < z; i++) {
        var v = s.y[i];
        if (log && v <= 0) { pen = false; continue; }
        var x = self.sx(s.x[i], b), y = sy(v);
        if (pen && prev !== null && s.x[i] - prev > s.gap) pen = false;
        if (pen) g.lineTo(x, y); else g.moveTo(x, y);
        pen = true; prev = s.x[i]; n++;
      }
      g.stroke();
      g.setLineDash([]);
      // dots: for point series, for short series, and for readings with no neighbour
      // close enough to draw a line to (a memory report logged once)
      var few = z - a <= 60;
      for (var j = a; j < z; j++) {
        if (log && s.y[j] <= 0) continue;
        var lone = (j === 0 || s.x[j] - s.x[j - 1] > s.gap) && (j === s.x.length - 1 || s.x[j + 1] - s.x[j] > s.gap);
        if (s.kind !== "points" && !few && !lone) continue;
        g.beginPath();
        g.arc(self.sx(s.x[j], b), sy(s.y[j]), s.kind === "points" ? 2.6 : 2.0, 0, 2 * Math.PI);
        g.fill();
      }
      // non-finite values: red ticks along the top edge
      g.fillStyle = NONFINITE;
      s.nonfinite.forEach(function (r) {
        if (r[1] < view[0] || r[0] > view[1]) return;
        var p = self.sx(r[0], b), q = self.sx(r[1], b);
        g.fillRect(p - 1.5, b.y, Math.max(3, q - p + 3), 7);
        n++;
      });
      drawn[s.name] = n;
    });

    // finding markers
    this.markerHits = [];
    this.spec.markers.forEach(function (idx) {
      var f = DATA.findings[idx];
      if (f.step === null || f.step === undefined || f.step < view[0] || f.step > view[1]) return;
      var x = Math.round(self.sx(f.step, b)) + 0.5;
      var color = SEVERITY[f.severity] || SEVERITY.info;
      g.strokeStyle = color;
      g.globalAlpha = 0.55;
      g.beginPath(); g.moveTo(x, b.y); g.lineTo(x, b.y + b.h); g.stroke();
      g.globalAlpha = 1;
      g.fillStyle = color;
      g.beginPath(); g.moveTo(x - 6, b.y); g.lineTo(x + 6, b.y); g.lineTo(x, b.y + 9); g.closePath(); g.fill();
      self.markerHits.push({ x: x, idx: idx });
    });

    // hover crosshair and drag selection
    if (this.hoverStep !== null && this.hoverStep >= view[0] && this.hoverStep <= view[1]) {
      var hx = Math.round(this.sx(this.hoverStep, b)) + 0.5;
      g.strokeStyle = "rgba(29, 35, 42, 0.45)";
      g.beginPath(); g.moveTo(hx, b.y); g.lineTo(hx, b.y + b.h); g.stroke();
    }
    if (this.drag && this.drag.x1 !== undefined) {
      g.fillStyle = "rgba(21, 101, 192, 0.12)";
      var dx = Math.min(this.drag.x0, this.drag.x1);
      g.fillRect(dx, b.y, Math.abs(this.drag.x1 - this.drag.x0), b.h);
    }
    g.restore();

    this.box.dataset.rendered = "1";
    api.charts[this.spec.id] = {
      rendered: true,
      empty: false,
      log: log,
      view: view.slice(),
      series: this.spec.series.map(function (s) {
        return { name: s.name, points: s.x.length, nonfinite: s.nonfinite.length, drawn: drawn[s.name] || 0, visible: !self.hidden[s.name] };
      }),
      markers: this.markerHits.length,
      markerSteps: this.markerHits.map(function (m) { return DATA.findings[m.idx].step; }),
      lines: this.spec.lines.map(function (l) { return l.name; }),
      bands: this.spec.bands.reduce(function (n, band) { return n + band.ranges.length; }, 0)
    };
  };

  Chart.prototype.valuesAt = function (step) {
    var out = [];
    this.spec.series.forEach(function (s) {
      if (!s.x.length) return;
      var i = lowerBound(s.x, step);
      var best = i < s.x.length ? i : s.x.length - 1;
      if (i > 0 && (i >= s.x.length || step - s.x[i - 1] < s.x[i] - step)) best = i - 1;
      out.push({ name: s.name, step: s.x[best], value: s.y[best] });
      s.nonfinite.forEach(function (r) {
        if (step >= r[0] - 0.5 && step <= r[1] + 0.5) out.push({ name: s.name, step: step, value: NaN });
      });
    });
    return out;
  };

  Chart.prototype.bindMouse = function () {
    var self = this, canvas = this.canvas;
    function local(ev) {
      var r = canvas.getBoundingClientRect();
      return { x: ev.clientX - r.left, y: ev.clientY - r.top };
    }
    canvas.addEventListener("mousemove", function (ev) {
      var p = local(ev), b = self.plotBox();
      if (self.drag) { self.drag.x1 = Math.max(b.x, Math.min(b.x + b.w, p.x)); self.draw(); }
      if (p.x < b.x || p.x > b.x + b.w) { hover(null); return; }
      hover(self.stepAt(p.x, b), self, ev, p);
    });
    canvas.addEventListener("mouseleave", function () { hover(null); });
    canvas.addEventListener("mousedown", function (ev) {
      var p = local(ev);
      self.drag = { x0: p.x };
    });
    window.addEventListener("mouseup", function (ev) {
      if (!self.drag) return;
      var d = self.drag; self.drag = null;
      var b = self.plotBox();
      if (d.x1 !== undefined && Math.abs(d.x1 - d.x0) > 6) {
        var s0 = self.stepAt(Math.min(d.x0, d.x1), b), s1 = self.stepAt(Math.max(d.x0, d.x1), b);
        setView([s0, s1]);
      } else {
        var hit = self.markerAt(local(ev).x);
        if (hit !== null) showFinding(hit);
        self.draw();
      }
    });
    canvas.addEventListener("dblclick", function () { setView(full.slice()); });
  };

  Chart.prototype.markerAt = function (x) {
    var best = null, dist = 6;
    this.markerHits.forEach(function (m) {
      var d = Math.abs(m.x - x);
      if (d <= dist) { dist = d; best = m.idx; }
    });
    return best;
  };

  /* ---- shared state: hover and zoom -------------------------------------------------- */
  var tooltip = document.getElementById("tooltip");

  function hover(step, chart, ev, p) {
    charts.forEach(function (c) { c.hoverStep = step; c.draw(); });
    if (step === null || !chart) { tooltip.hidden = true; return; }
    while (tooltip.firstChild) tooltip.removeChild(tooltip.firstChild);
    tooltip.appendChild(el("div", null, "step " + fmtStep(step)));
    chart.valuesAt(step).forEach(function (v) {
      tooltip.appendChild(el("div", null, v.name + ": " + fmt(v.value) + (isFinite(v.value) ? " (step " + fmtStep(v.step) + ")" : "")));
    });
    var hit = chart.markerAt(p.x);
    if (hit !== null) {
      var f = DATA.findings[hit];
      tooltip.appendChild(el("div", "f", f.code + " " + f.severity + " (step " + fmtStep(f.step) + "): " + f.title));
    }
    tooltip.hidden = false;
    var x = ev.clientX + 14, y = ev.clientY + 12;
    var w = tooltip.offsetWidth, h = tooltip.offsetHeight;
    if (x + w > window.innerWidth - 8) x = ev.clientX - w - 14;
    if (y + h > window.innerHeight - 8) y = ev.clientY - h - 12;
    tooltip.style.left = x + "px";
    tooltip.style.top = y + "px";
  }

  function setView(range) {
    var lo = Math.max(full[0], range[0]), hi = Math.min(full[1], range[1]);
    if (!(hi > lo)) { lo = full[0]; hi = full[1]; }
    view = [lo, hi];
    charts.forEach(function (c) { c.draw(); });
  }

  /* ---- findings list ----------------------------------------------------------------- */
  function findingCard(f, idx, withStep) {
    var li = el("li", "finding " + f.severity);
    li.id = "finding-" + idx;
    li.dataset.code = f.code;
    li.dataset.severity = f.severity;
    if (f.step !== null && f.step !== undefined) li.dataset.step = String(f.step);
    var head = el("div", "head");
    head.appendChild(el("span", "code", f.code));
    head.appendChild(el("span", "sev", f.severity));
    head.appendChild(el("span", "title", f.title));
    if (withStep && f.step !== null && f.step !== undefined) {
      var st = el("span", "step");
      var a = el("a", null, "step " + fmtStep(f.step) + " — show on the curves");
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
    if (s.first_step !== null && s.first_step !== undefined) parts.push("steps " + fmtStep(s.first_step) + "–" + fmtStep(s.last_step));
    if (s.interval) parts.push("logged every " + fmtStep(s.interval) + " step" + (s.interval === 1 ? "" : "s"));
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

  function renderNotes() {
    if (!DATA.notes.length) return;
    document.getElementById("notes-section").hidden = false;
    document.getElementById("toc-notes").hidden = false;
    var ul = document.getElementById("note-list");
    DATA.notes.forEach(function (n) { ul.appendChild(el("li", null, n)); });
  }

  try {
    renderHeader();
    DATA.charts.forEach(function (spec, i) {
      var c = new Chart(spec, i);
      if (c.canvas) charts.push(c);
    });
    charts.forEach(function (c) { c.draw(); });
    renderFindings();
    renderChecklist();
    renderNotes();
    var pending = null;
    window.addEventListener("resize", function () {
      if (pending) cancelAnimationFrame(pending);
      pending = requestAnimationFrame(function () { charts.forEach(function (c) { c.draw(); }); });
    });
    api.setView = setView;
    api.reset = function () { setView(full.slice()); };
    api.fullRange = full.slice();
    api.findings = DATA.findings.length;
    api.renderedAt = performance.now();  // ms since navigation start: the time to open
    api.ready = true;
    document.body.dataset.ready = "1";
  } catch (err) {
    api.errors.push(String(err && err.stack || err));
    console.error("sapper report failed to render:", err);
  }
})();
