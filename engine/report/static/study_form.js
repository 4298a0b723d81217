(function () {
  const DATA = JSON.parse(document.getElementById('study-data').textContent);
  const $ = (id) => document.getElementById(id);
  const params = new URLSearchParams((location.hash || '').replace(/^#/, '') || location.search.replace(/^\?/, ''));
  const formSelect = $('form-number');
  DATA.forms.forEach((f) => { const o = document.createElement('option'); o.value = f.form; o.textContent = f.form; formSelect.appendChild(o); });
  if (params.get('form')) formSelect.value = params.get('form');
  if (params.get('participant')) $('participant').value = params.get('participant');
  let form = null, index = 0, shownAt = 0; const answers = [];
  function csvCell(v) { v = String(v == null ? '' : v); return /[",\n]/.test(v) ? '"' + v.replace(/"/g, '""') + '"' : v; }
  function setBlock(title, setId) {
    const div = document.createElement('div'); div.className = 'set';
    if (title) { const h = document.createElement('h3'); h.textContent = title; div.appendChild(h); }
    const grid = document.createElement('div'); grid.className = 'grid';
    DATA.sets[setId].forEach((uri, i) => { const img = document.createElement('img'); img.src = uri; img.alt = 'image ' + (i + 1); grid.appendChild(img); });
    div.appendChild(grid); return div;
  }
  function show() {
    const item = form.items[index];
    $('progress').textContent = 'Item ' + (index + 1) + ' of ' + form.items.length;
    const sets = $('sets'); sets.innerHTML = '';
    if (item.sets.length === 2) { sets.appendChild(setBlock('Left set', item.sets[0])); sets.appendChild(setBlock('Right set', item.sets[1])); }
    else sets.appendChild(setBlock('', item.sets[0]));
    $('question').textContent = item.question;
    const opts = $('options'); opts.innerHTML = '';
    DATA.options.forEach((o) => {
      const label = document.createElement('label'); const input = document.createElement('input');
      input.type = 'radio'; input.name = 'answer'; input.value = o.value;
      input.addEventListener('change', () => { $('next').disabled = false; });
      const span = document.createElement('span'); span.textContent = ' ' + o.label;
      label.appendChild(input); label.appendChild(span); opts.appendChild(label);
    });
    $('next').disabled = true; $('next').textContent = index + 1 === form.items.length ? 'Finish' : 'Next';
    shownAt = performance.now(); window.scrollTo(0, 0);
  }
  $('start').addEventListener('click', () => {
    const pid = $('participant').value.trim();
    if (!pid) { $('start-error').textContent = 'Please enter your participant ID.'; return; }
    form = DATA.forms.find((f) => String(f.form) === String(formSelect.value));
    $('intro').classList.add('hidden'); $('study').classList.remove('hidden'); index = 0; show();
  });
  $('next').addEventListener('click', () => {
    const chosen = document.querySelector('input[name=answer]:checked'); if (!chosen) return;
    const item = form.items[index];
    answers.push([$('participant').value.trim(), form.form, index + 1, item.item, item.sets[0], item.sets[1] || '',
                  chosen.value, Math.round(performance.now() - shownAt)]);
    index += 1;
    if (index < form.items.length) { show(); return; }
    $('study').classList.add('hidden'); $('done').classList.remove('hidden');
    const header = ['participant', 'form', 'position', 'item', 'set_a', 'set_b', 'answer', 'rt_ms'];
    const text = [header].concat(answers).map((r) => r.map(csvCell).join(',')).join('\n') + '\n';
    const link = $('download');
    link.href = URL.createObjectURL(new Blob([text], {type: 'text/csv'}));
    link.download = 'answers-' + $('participant').value.trim().replace(/[^A-Za-z0-9_-]/g, '_') + '-form' + form.form + '.csv';
    $('csv-text').value = text;
  });
})();
