/* The course's explorers on the website: draw each figure with the site's own plotly.js and give every
   Plotly slider and drop-down a native twin (<input type="range">, <select>) that the keyboard and
   screen readers can use.  Plotly's own controls are drawn in SVG and take no keyboard focus, so the
   twins replace them; each twin applies the same precomputed step (restyle, relayout or update) the
   figure's data describes.  Nothing here computes: every state was computed when the page was built. */
(function () {
  "use strict";
  let counter = 0;

  function apply(plot, step) {
    const args = (step.args || []).map(a => JSON.parse(JSON.stringify(a)));   // Plotly mutates its arguments
    return Plotly[step.method](plot, ...args);
  }

  function label(text, control) {
    const wrap = document.createElement("label");
    wrap.className = "attn-control";
    const span = document.createElement("span");
    span.textContent = text;
    wrap.append(span, control);
    return wrap;
  }

  function slider(plot, spec) {
    const input = document.createElement("input");
    const output = document.createElement("output");
    const steps = spec.steps || [];
    input.type = "range";
    input.min = 0;
    input.max = steps.length - 1;
    input.step = 1;
    input.value = spec.active || 0;
    input.id = "attn-control-" + (++counter);
    const show = () => {
      output.textContent = steps[input.value].label;
      input.setAttribute("aria-valuetext", (spec.currentvalue && spec.currentvalue.prefix || "") + steps[input.value].label);
    };
    input.addEventListener("input", () => { show(); apply(plot, steps[input.value]); });
    show();
    const wrap = label((spec.currentvalue && spec.currentvalue.prefix || "").trim(), input);
    wrap.append(output);
    return wrap;
  }

  function menu(plot, spec, title) {
    const select = document.createElement("select");
    select.id = "attn-control-" + (++counter);
    (spec.buttons || []).forEach((b, i) => {
      const option = document.createElement("option");
      option.value = i;
      option.textContent = b.label;
      select.append(option);
    });
    select.value = spec.active || 0;
    select.addEventListener("change", () => apply(plot, spec.buttons[select.value]));
    const wrap = label(spec.name || "", select);
    if (!spec.name) select.setAttribute("aria-label", title);     // no visible label: the figure's title names it
    return wrap;
  }

  function draw(figure) {
    const source = figure.querySelector("script.attn-spec");
    const plot = figure.querySelector(".attn-plot");
    if (!source || !plot || figure.dataset.drawn) return;
    figure.dataset.drawn = "1";
    const spec = JSON.parse(source.textContent);
    const layout = spec.layout || {};
    const sliders = layout.sliders || [], menus = layout.updatemenus || [];
    delete layout.sliders;
    delete layout.updatemenus;
    // The title starts at the left, clear of Plotly's tool bar (top right).
    if (layout.title) layout.title = Object.assign({}, typeof layout.title === "string" ? {text: layout.title} : layout.title,
                                                   {x: 0.01, xanchor: "left"});
    const controls = figure.querySelector(".attn-controls");
    Plotly.newPlot(plot, spec.data, layout, {responsive: true, displaylogo: false}).then(() => {
      const title = (layout.title && (layout.title.text || layout.title)) || "";
      menus.forEach(m => controls.append(menu(plot, m, typeof title === "string" ? title : "")));
      sliders.forEach(s => controls.append(slider(plot, s)));
      figure.dataset.ready = "1";
    });
  }

  function drawAll() {
    if (!window.Plotly) return;
    document.querySelectorAll("figure.attn-explorer").forEach(draw);
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", drawAll);
  else drawAll();
})();
