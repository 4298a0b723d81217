/* GapLens chart runtime: draws every <div class="gl-vega" data-spec="..."> with vega-embed (SVG),
   those in the page now and those added later (Gradio replaces gr.HTML content on each update),
   once per element and spec. A click on a mark dispatches a bubbling
   CustomEvent("gl-vega-click", {detail: {chart_id, datum}}) from the chart's element. */
(function () {
  if (window.glVegaRuntime) return;
  window.glVegaRuntime = true;
  const drawn = new WeakMap();

  function plain(datum) {
    const out = {};
    for (const key of Object.keys(datum || {})) {
      const v = datum[key];
      if (v === null || ['string', 'number', 'boolean'].includes(typeof v)) out[key] = v;
    }
    return out;
  }

  function draw(el) {
    const text = el.getAttribute('data-spec');
    if (!text || drawn.get(el) === text) return;
    drawn.set(el, text);
    let spec;
    try { spec = JSON.parse(text); } catch (err) { el.setAttribute('data-error', String(err)); return; }
    const id = el.getAttribute('data-chart') || el.id;
    window.vegaEmbed(el, spec, {renderer: 'svg', actions: false}).then((result) => {
      el.setAttribute('data-rendered', 'true');
      result.view.addEventListener('click', (event, item) => {
        if (!item || !item.datum) return;
        el.dispatchEvent(new CustomEvent('gl-vega-click',
          {bubbles: true, detail: {chart_id: id, datum: plain(item.datum)}}));
      });
    }).catch((err) => { el.setAttribute('data-error', String(err)); });
  }

  function scan() { document.querySelectorAll('.gl-vega[data-spec]').forEach(draw); }

  let pending = null;
  function later() { if (pending === null) pending = setTimeout(() => { pending = null; scan(); }, 20); }

  function start() {
    new MutationObserver(later).observe(document.documentElement,
      {childList: true, subtree: true, attributes: true, attributeFilter: ['data-spec']});
    scan();
  }
  if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', start);
  else start();
})();
