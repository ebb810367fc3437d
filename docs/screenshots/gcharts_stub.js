// Offline stand-in for https://www.gstatic.com/charts/loader.js (no network here): the
// profiler plugin's own UI (tables, selectors, trace viewer) renders; Google's charts do not,
// each chart box says so instead.
(function () {
  function DataTable() { this.cols = []; this.rows = []; this.props = {}; }
  DataTable.prototype.addColumn = function (c) { this.cols.push(c); return this.cols.length - 1; };
  DataTable.prototype.addRows = function (r) { if (typeof r === "number") { for (var i = 0; i < r; i++) this.rows.push([]); } else { this.rows = this.rows.concat(r); } };
  DataTable.prototype.addRow = function (r) { this.rows.push(r || []); };
  DataTable.prototype.setProperty = function () {};
  DataTable.prototype.setCell = function () {};
  DataTable.prototype.getNumberOfRows = function () { return this.rows.length; };
  DataTable.prototype.getNumberOfColumns = function () { return this.cols.length; };
  DataTable.prototype.getValue = function (r, c) { var v = (this.rows[r] || [])[c]; return v && typeof v === "object" && "v" in v ? v.v : v; };
  function Chart(el) { this.el = el; }
  Chart.prototype.draw = function (data, opts) {
    if (!this.el) return;
    var t = (opts && opts.title) ? opts.title + ": " : "";
    this.el.innerHTML = '<div style="padding:8px;color:#888;font:12px sans-serif;border:1px dashed #ccc">' + t +
      'chart not drawn (Google Charts is fetched from gstatic.com; this capture ran offline)</div>';
  };
  Chart.prototype.clearChart = function () { if (this.el) this.el.innerHTML = ""; };
  Chart.prototype.setSelection = function () {};
  Chart.prototype.getSelection = function () { return []; };
  var vis = { DataTable: DataTable, arrayToDataTable: function (a) { var d = new DataTable(); (a[0] || []).forEach(function (c) { d.addColumn({ label: c }); }); d.addRows(a.slice(1)); return d; },
    events: { addListener: function () { return {}; }, removeListener: function () {}, removeAllListeners: function () {} } };
  ["PieChart", "LineChart", "ColumnChart", "ComboChart", "SteppedAreaChart", "Timeline", "Table", "BarChart", "AreaChart"].forEach(function (n) { vis[n] = Chart; });
  window.google = window.google || {};
  window.google.visualization = vis;
  window.google.charts = { load: function () { return Promise.resolve(); }, setOnLoadCallback: function (f) { Promise.resolve().then(f); } };
})();
