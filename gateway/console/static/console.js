// Switchyard console: the little JavaScript the pages need. No inline script anywhere
// (the Content-Security-Policy forbids it): charts read their data from JSON endpoints or
// data-* attributes, and forms ask for confirmation through data-confirm.
"use strict";

(function () {
  const COLORS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#ca8a04"];
  const REFRESH_MS = 10000;

  function timeLabel(seconds) {
    const d = new Date(seconds * 1000);
    return d.toISOString().slice(11, 16) + "Z";
  }

  function lineChart(canvas, labels, series) {
    return new window.Chart(canvas, {
      type: "line",
      data: {
        labels: labels,
        datasets: series.map(function (s, i) {
          return { label: s.label, data: s.data, borderColor: COLORS[i % COLORS.length],
                   backgroundColor: COLORS[i % COLORS.length], spanGaps: true, tension: 0.2,
                   pointRadius: 2 };
        }),
      },
      options: { animation: false, responsive: true, maintainAspectRatio: false,
                 scales: { y: { beginAtZero: true } } },
    });
  }

  function timelineSeries(points) {
    const pick = function (name) { return points.map(function (p) { return p[name]; }); };
    return {
      "chart-traffic": [{ label: "requests", data: pick("requests") },
                        { label: "errors", data: pick("errors") }],
      "chart-latency": [{ label: "p50", data: pick("latency_p50_ms") },
                        { label: "p95", data: pick("latency_p95_ms") },
                        { label: "p99", data: pick("latency_p99_ms") }],
      "chart-ttft": [{ label: "p50", data: pick("ttft_p50_ms") },
                     { label: "p95", data: pick("ttft_p95_ms") }],
      "chart-cost": [{ label: "USD", data: pick("cost_usd") }],
    };
  }

  function startTimeline(section) {
    const url = section.getAttribute("data-timeline");
    const charts = {};
    function draw(body) {
      const labels = body.points.map(function (p) { return timeLabel(p.t); });
      const series = timelineSeries(body.points);
      Object.keys(series).forEach(function (id) {
        const canvas = document.getElementById(id);
        if (!canvas) { return; }
        if (charts[id]) {
          charts[id].data.labels = labels;
          series[id].forEach(function (s, i) { charts[id].data.datasets[i].data = s.data; });
          charts[id].update();
        } else {
          charts[id] = lineChart(canvas, labels, series[id]);
        }
      });
      section.setAttribute("data-loaded", String(body.points.length));
    }
    function load() {
      fetch(url, { credentials: "same-origin", headers: { accept: "application/json" } })
        .then(function (r) {
          if (r.redirected) { window.location.href = "/console/login"; }  // the session ended
          if (r.status === 200 && !r.redirected) { return r.json(); }
          throw new Error(String(r.status));
        })
        .then(draw)
        .catch(function () { section.setAttribute("data-error", "1"); });
    }
    load();
    window.setInterval(load, REFRESH_MS);
  }

  function startUsageChart(canvas) {
    const data = JSON.parse(canvas.getAttribute("data-usage"));
    new window.Chart(canvas, {
      type: "bar",
      data: {
        labels: data.labels,
        datasets: data.datasets.map(function (d, i) {
          return { label: d.label, data: d.data, backgroundColor: COLORS[i % COLORS.length] };
        }),
      },
      options: { animation: false, responsive: true, maintainAspectRatio: false,
                 scales: { x: { stacked: true }, y: { stacked: true, beginAtZero: true } } },
    });
    canvas.setAttribute("data-drawn", String(data.labels.length));
  }

  function confirmForms() {
    document.querySelectorAll("form[data-confirm]").forEach(function (form) {
      form.addEventListener("submit", function (event) {
        if (!window.confirm(form.getAttribute("data-confirm"))) { event.preventDefault(); }
      });
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    confirmForms();
    if (window.Chart) {
      document.querySelectorAll("[data-timeline]").forEach(startTimeline);
      document.querySelectorAll("canvas[data-usage]").forEach(startUsageChart);
    }
  });
})();
