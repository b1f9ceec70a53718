// tide dashboard: confirmations, auto-refresh and local times. The pages
// work without this script; it only makes them nicer.
(function () {
  'use strict';

  // Ask before destructive actions (forms with data-confirm), and disable
  // the button once a form is on its way so it is not sent twice.
  document.addEventListener('submit', function (e) {
    var form = e.target;
    var sub = e.submitter || null;
    if (form.id === 'selection' && selectedCount() === 0) {
      e.preventDefault();
      var note = document.getElementById('selection-count');
      if (note) {
        note.textContent = 'Select tasks first:';
      }
      return;
    }
    var msg = (sub && sub.getAttribute('data-confirm')) || form.getAttribute('data-confirm');
    if (msg && !window.confirm(msg)) {
      e.preventDefault();
      return;
    }
    var btn = sub || form.querySelector('button[type=submit]');
    if (btn) {
      window.setTimeout(function () { btn.disabled = true; }, 0);
    }
  });

  // Optional auto-refresh every 5 seconds, remembered per browser.
  var box = document.getElementById('autorefresh');
  if (box) {
    var key = 'tide.dashboard.autorefresh';
    var timer = 0;
    var arm = function () {
      window.clearTimeout(timer);
      if (!box.checked) {
        return;
      }
      timer = window.setTimeout(function () {
        if (document.hidden) {
          arm();
        } else {
          window.location.reload();
        }
      }, 5000);
    };
    try {
      box.checked = window.localStorage.getItem(key) === '1';
    } catch (err) { /* storage disabled */ }
    box.addEventListener('change', function () {
      try {
        window.localStorage.setItem(key, box.checked ? '1' : '0');
      } catch (err) { /* storage disabled */ }
      arm();
    });
    arm();
  }

  // Row selection: "select all" and a count of the selected rows.
  function boxes() {
    return document.querySelectorAll('input.sel-box');
  }
  function selectedCount() {
    var n = 0;
    var bs = boxes();
    for (var i = 0; i < bs.length; i++) {
      if (bs[i].checked) {
        n++;
      }
    }
    return n;
  }
  function showSelected() {
    var note = document.getElementById('selection-count');
    if (note) {
      var n = selectedCount();
      note.textContent = n === 0 ? 'Selected tasks:' : n + (n === 1 ? ' task selected:' : ' tasks selected:');
    }
  }
  var all = document.getElementById('select-all');
  if (all) {
    all.addEventListener('change', function () {
      var bs = boxes();
      for (var i = 0; i < bs.length; i++) {
        bs[i].checked = all.checked;
      }
      showSelected();
    });
  }
  document.addEventListener('change', function (e) {
    if (e.target && e.target.classList && e.target.classList.contains('sel-box')) {
      showSelected();
    }
  });

  // The live view: poll the JSON endpoint and redraw, without reloading.
  var live = document.getElementById('live');
  if (live && window.fetch) {
    startLive(live);
  }

  // Show the local time of every timestamp on hover.
  var times = document.querySelectorAll('time[datetime]');
  for (var i = 0; i < times.length; i++) {
    var d = new Date(times[i].getAttribute('datetime'));
    if (!isNaN(d.getTime())) {
      times[i].title = d.toLocaleString() + ' (local) · ' + times[i].title;
    }
  }

  function startLive(panel) {
    var src = panel.getAttribute('data-src');
    var every = parseInt(panel.getAttribute('data-interval'), 10) || 5000;
    var status = document.getElementById('live-status');
    var updates = 0;
    var timer = 0;
    var setText = function (id, text) {
      var el = document.getElementById(id);
      if (el) {
        el.textContent = text;
      }
    };
    var poll = function () {
      window.clearTimeout(timer);
      if (document.hidden) {
        timer = window.setTimeout(poll, every);
        return;
      }
      window.fetch(src, { credentials: 'same-origin', headers: { Accept: 'application/json' }, cache: 'no-store' })
        .then(function (resp) {
          return resp.json().then(function (body) {
            if (!resp.ok) {
              throw new Error(body && body.error ? body.error : 'HTTP ' + resp.status);
            }
            return body;
          });
        })
        .then(function (d) {
          updates++;
          setText('live-rate-processed', rate(d.processed_per_sec));
          setText('live-rate-failed', rate(d.failed_per_sec));
          setText('live-processed-hour', fmt(d.processed_last_hour));
          setText('live-failed-hour', fmt(d.failed_last_hour));
          setText('live-pending', fmt(d.sizes.pending));
          setText('live-active', fmt(d.sizes.active));
          setText('live-scheduled', fmt(d.sizes.scheduled) + ' · ' + fmt(d.sizes.retry));
          // The page's own counts (cards, tabs) follow the live sizes.
          var counts = document.querySelectorAll('[data-live]');
          for (var i = 0; i < counts.length; i++) {
            var k = counts[i].getAttribute('data-live');
            if (d.sizes && Object.prototype.hasOwnProperty.call(d.sizes, k)) {
              counts[i].textContent = fmt(d.sizes[k]);
            }
          }
          drawThroughput(document.getElementById('live-throughput'), d.points || []);
          drawPending(document.getElementById('live-pending-chart'), d.points || []);
          panel.setAttribute('data-updates', String(updates));
          panel.classList.remove('stale');
          if (status) {
            status.textContent = 'live · updated ' + new Date(d.now).toLocaleTimeString() + ' · every ' + Math.round(every / 1000) + ' s';
          }
        })
        .catch(function (err) {
          panel.classList.add('stale');
          if (status) {
            status.textContent = 'not updated: ' + err.message;
          }
        })
        .then(function () {
          timer = window.setTimeout(poll, every);
        });
    };
    poll();
  }

  function fmt(n) {
    return (n || 0).toLocaleString('en-US');
  }

  function rate(x) {
    x = x || 0;
    if (x === 0) {
      return '0';
    }
    return x < 10 ? x.toFixed(2) : x.toFixed(1);
  }

  var NS = 'http://www.w3.org/2000/svg';

  function el(name, attrs, text) {
    var e = document.createElementNS(NS, name);
    for (var k in attrs) {
      if (Object.prototype.hasOwnProperty.call(attrs, k)) {
        e.setAttribute(k, String(attrs[k]));
      }
    }
    if (text !== undefined) {
      e.textContent = text;
    }
    return e;
  }

  function niceTop(most) {
    if (most <= 0) {
      return 1;
    }
    var p = Math.pow(10, Math.floor(Math.log10(most)));
    var ms = [1, 2, 2.5, 5, 10];
    for (var i = 0; i < ms.length; i++) {
      if (ms[i] * p >= most) {
        return ms[i] * p;
      }
    }
    return 10 * p;
  }

  // frame draws the grid, ticks and time labels of a live chart and
  // returns its x and y scales.
  function frame(svg, n, top, label) {
    while (svg.firstChild) {
      svg.removeChild(svg.firstChild);
    }
    var vb = svg.viewBox.baseVal;
    var left = 52, right = vb.width - 12, topY = 10, base = vb.height - 22;
    var x = function (i) { return left + (n <= 1 ? 0 : (right - left) * i / (n - 1)); };
    var y = function (v) { return base - (v / top) * (base - topY); };
    for (var t = 0; t <= 2; t++) {
      var v = top * t / 2;
      svg.appendChild(el('line', { 'class': 'grid', x1: left, x2: right, y1: y(v), y2: y(v) }));
      svg.appendChild(el('text', { 'class': 'tick', x: left - 8, y: y(v), 'text-anchor': 'end', 'dominant-baseline': 'middle' }, label(v)));
    }
    svg.appendChild(el('line', { 'class': 'axis', x1: left, x2: right, y1: base, y2: base }));
    var marks = [[0, '60 min ago'], [0.25, '45 min'], [0.5, '30 min'], [0.75, '15 min'], [1, 'now']];
    for (var m = 0; m < marks.length; m++) {
      svg.appendChild(el('text', { 'class': 'xlabel', x: left + (right - left) * marks[m][0], y: base + 16,
        'text-anchor': m === 0 ? 'start' : (m === marks.length - 1 ? 'end' : 'middle') }, marks[m][1]));
    }
    return { x: x, y: y, base: base };
  }

  function line(svg, pts, cls) {
    if (pts.length > 0) {
      svg.appendChild(el('polyline', { 'class': cls, points: pts.join(' ') }));
    }
  }

  function drawThroughput(svg, ps) {
    if (!svg) {
      return;
    }
    var most = 0;
    for (var i = 0; i < ps.length; i++) {
      most = Math.max(most, ps[i].processed / 60, ps[i].failed / 60);
    }
    var top = niceTop(most);
    var f = frame(svg, ps.length, top, function (v) { return v < 10 ? String(Math.round(v * 100) / 100) : String(Math.round(v)); });
    var ok = [], bad = [];
    for (var j = 0; j < ps.length; j++) {
      var xs = f.x(j).toFixed(1);
      ok.push(xs + ',' + f.y(ps[j].processed / 60).toFixed(1));
      bad.push(xs + ',' + f.y(ps[j].failed / 60).toFixed(1));
    }
    if (ps.length > 0) {
      var area = ok.slice();
      area.push(f.x(ps.length - 1).toFixed(1) + ',' + f.base, f.x(0).toFixed(1) + ',' + f.base);
      svg.appendChild(el('polygon', { 'class': 'area-ok', points: area.join(' ') }));
    }
    line(svg, ok, 'line-ok');
    line(svg, bad, 'line-failed');
    if (most === 0) {
      svg.appendChild(el('text', { 'class': 'empty', x: svg.viewBox.baseVal.width / 2, y: f.base / 2 + 6, 'text-anchor': 'middle' }, 'nothing processed in the last hour'));
    }
  }

  function drawPending(svg, ps) {
    if (!svg) {
      return;
    }
    var most = 0, any = false;
    for (var i = 0; i < ps.length; i++) {
      if (ps[i].pending >= 0) {
        any = true;
        most = Math.max(most, ps[i].pending);
      }
    }
    var top = Math.max(niceTop(most), 2);
    var f = frame(svg, ps.length, top, function (v) { return fmt(v); });
    var seg = [];
    for (var j = 0; j < ps.length; j++) {
      if (ps[j].pending < 0) {
        line(svg, seg, 'line-pending');
        seg = [];
        continue;
      }
      seg.push(f.x(j).toFixed(1) + ',' + f.y(ps[j].pending).toFixed(1));
    }
    line(svg, seg, 'line-pending');
    if (!any) {
      svg.appendChild(el('text', { 'class': 'empty', x: svg.viewBox.baseVal.width / 2, y: f.base / 2 + 6, 'text-anchor': 'middle' }, 'no samples: no server ran in the last hour'));
    }
  }
})();
