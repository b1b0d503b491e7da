// This server's GPU load in JupyterLab's status bar, and a panel with the last
// hour. The figures come from gpuspawner-culler (DCGM through Prometheus) via
// this server's /gpuspawner/gpu-status: no NVML is needed in the container.
// Everything the server sends is shown as text (textContent, setAttribute with
// numbers): never parsed as HTML.
import { Widget } from '@lumino/widgets';

const SVG = 'http://www.w3.org/2000/svg';
const GIB = 1024 ** 3;

/** 14:05 in the browser's local time, as the cull warning writes times. */
export function clock(epochSeconds) {
  return new Date(epochSeconds * 1000).toLocaleTimeString([], {
    hour: '2-digit',
    minute: '2-digit'
  });
}

/** "12 min", "1 h 05 min": a duration in whole minutes, never negative. */
export function minutes(seconds) {
  const total = Math.max(0, Math.floor(seconds / 60));
  if (total < 60) {
    return `${total} min`;
  }
  const m = total % 60;
  return `${Math.floor(total / 60)} h ${m < 10 ? '0' : ''}${m} min`;
}

/** "12.0/160 GiB": used with one decimal, the total as short as it is exact. */
export function memoryText(used, total) {
  const t = total / GIB;
  const shortTotal = Math.abs(t - Math.round(t)) < 0.05 ? `${Math.round(t)}` : t.toFixed(1);
  return `${(used / GIB).toFixed(1)}/${shortTotal} GiB`;
}

function isNumber(x) {
  return typeof x === 'number' && Number.isFinite(x);
}

/** No figures to show: the culler's one sentence why (or ours). */
export function unavailableReason(status) {
  if (status.unavailable) {
    return String(status.unavailable);
  }
  if (!status.source || !isNumber(status.utilization)) {
    return 'The culler has no GPU figures for this server yet.';
  }
  return null;
}

/** Seconds the GPUs have been idle at `now`, or null when busy or unknown. */
export function idleSeconds(status, now) {
  if (status.busy) {
    return null;
  }
  if (isNumber(status.idle_since)) {
    return Math.max(0, now - status.idle_since);
  }
  return isNumber(status.idle_seconds) ? status.idle_seconds : null;
}

/** "2×A100": how many GPUs of which type. */
export function gpusText(status) {
  const count = isNumber(status.gpus) ? status.gpus : '?';
  return status.gpu_type ? `${count}×${status.gpu_type}` : `${count}`;
}

/** The status-bar item's one line. */
export function itemText(status, now) {
  if (unavailableReason(status) !== null) {
    return 'GPU load unavailable';
  }
  const idle = idleSeconds(status, now);
  if (idle !== null) {
    const stop = isNumber(status.stop_at) ? ` · stops ${clock(status.stop_at)}` : '';
    return `GPUs idle ${minutes(idle)}${stop}`;
  }
  const pct = Math.round(status.utilization * 100);
  const memory = isNumber(status.memory_total_bytes)
    ? ` · ${memoryText(status.memory_used_bytes || 0, status.memory_total_bytes)}`
    : '';
  return `GPU ${gpusText(status)} ${pct}%${memory}`;
}

/** The culler's rule for this server in words, with the time left if it applies. */
export function ruleText(status, now) {
  if (!isNumber(status.stop_at) || !status.stop_rule) {
    return 'No culler rule stops this server as it is now.';
  }
  const left = minutes(status.stop_at - now);
  // the culler's own words for the rule: "GPU idle timeout of 1 h", "maximum age of 8 h", ...
  return (
    `The culler stops this server at ${clock(status.stop_at)} (in ${left}) if it stays ` +
    `as it is: ${status.stop_rule}.`
  );
}

/** The item's hover title: why there are no figures, or the rule. */
export function itemTitle(status, now) {
  const reason = unavailableReason(status);
  if (reason !== null) {
    return reason;
  }
  return `${ruleText(status, now)} Click for the last hour.`;
}

/**
 * The polyline points of the last hour's utilisation in a width×height box:
 * x from now-3600 s to now, y from 100 % (top) to 0 % (bottom). Points outside
 * the hour or without a number are left out.
 */
export function chartPoints(points, now, width, height) {
  const start = now - 3600;
  const out = [];
  for (const point of Array.isArray(points) ? points : []) {
    if (!Array.isArray(point) || !isNumber(point[0]) || !isNumber(point[1])) {
      continue;
    }
    const [t, u] = point;
    if (t < start || t > now + 60) {
      continue;
    }
    const x = Math.min(width, ((t - start) / 3600) * width);
    const y = height - Math.min(1, Math.max(0, u)) * height;
    out.push(`${x.toFixed(1)},${y.toFixed(1)}`);
  }
  return out.join(' ');
}

function svg(tag, attributes) {
  const element = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attributes)) {
    element.setAttribute(name, String(value));
  }
  return element;
}

function text(tag, content, className) {
  const element = document.createElement(tag);
  element.textContent = content;
  if (className) {
    element.className = className;
  }
  return element;
}

/** The last hour's chart: 0-100 % against time, drawn by hand. */
export function chart(history, now) {
  const [width, height, left, bottom] = [360, 120, 40, 20];
  const root = svg('svg', {
    width: width + left + 10,
    height: height + bottom + 10,
    role: 'img',
    class: 'gpuspawner-gpu-chart'
  });
  const title = svg('title', {});
  title.textContent = 'Mean GPU utilisation over the last hour';
  root.appendChild(title);
  const plot = svg('g', { transform: `translate(${left},5)` });
  for (const pct of [0, 50, 100]) {
    const y = height - (pct / 100) * height;
    plot.appendChild(
      svg('line', { x1: 0, x2: width, y1: y, y2: y, stroke: 'currentColor', 'stroke-opacity': 0.2 })
    );
    const label = svg('text', { x: -6, y: y + 4, 'text-anchor': 'end', 'font-size': 10, fill: 'currentColor' });
    label.textContent = `${pct}%`;
    plot.appendChild(label);
  }
  for (const [x, t] of [
    [0, now - 3600],
    [width / 2, now - 1800],
    [width, now]
  ]) {
    const label = svg('text', { x, y: height + 15, 'text-anchor': 'middle', 'font-size': 10, fill: 'currentColor' });
    label.textContent = clock(t);
    plot.appendChild(label);
  }
  const points = chartPoints(history && history.points, now, width, height);
  if (points) {
    plot.appendChild(
      svg('polyline', {
        points,
        fill: 'none',
        stroke: 'var(--jp-brand-color1, #1976d2)',
        'stroke-width': 2,
        class: 'gpuspawner-gpu-line'
      })
    );
  }
  root.appendChild(plot);
  return root;
}

/** The panel opened from the item: per-GPU figures, the rule, the last hour. */
export class GpuPanel extends Widget {
  constructor() {
    super();
    this.id = 'gpuspawner-gpu-panel';
    this.title.label = 'GPU load';
    this.title.closable = true;
    this.addClass('gpuspawner-gpu-panel');
    this.node.style.padding = '12px';
    this.node.style.overflow = 'auto';
  }

  /** Draw `status` (or keep the last one when null: the item goes, the panel says so). */
  render(status, now) {
    const node = this.node;
    node.replaceChildren();
    if (!status) {
      node.appendChild(text('p', 'This server has no GPUs to show.'));
      return;
    }
    node.appendChild(text('h2', `GPUs of this server: ${gpusText(status)}`));
    const reason = unavailableReason(status);
    if (reason !== null) {
      node.appendChild(text('p', reason, 'gpuspawner-gpu-unavailable'));
      return;
    }
    node.appendChild(text('p', itemText(status, now), 'gpuspawner-gpu-summary'));
    node.appendChild(text('p', ruleText(status, now), 'gpuspawner-gpu-rule'));
    const table = document.createElement('table');
    table.className = 'gpuspawner-gpu-devices';
    const head = document.createElement('tr');
    for (const name of ['GPU', 'Utilisation', 'Memory']) {
      head.appendChild(text('th', name));
    }
    table.appendChild(head);
    for (const device of Array.isArray(status.devices) ? status.devices : []) {
      const row = document.createElement('tr');
      row.appendChild(text('td', String(device.gpu ?? '?')));
      row.appendChild(
        text('td', isNumber(device.utilization) ? `${Math.round(device.utilization * 100)}%` : '–')
      );
      row.appendChild(
        text(
          'td',
          isNumber(device.memory_total_bytes)
            ? memoryText(device.memory_used_bytes || 0, device.memory_total_bytes)
            : '–'
        )
      );
      table.appendChild(row);
    }
    node.appendChild(table);
    node.appendChild(text('h3', 'Utilisation, last hour'));
    node.appendChild(chart(status.history, now));
  }
}

/** The status-bar item: one line of text, the rule as its title; click opens the panel. */
export class GpuItem extends Widget {
  constructor(onClick) {
    super();
    this.addClass('gpuspawner-gpu-item');
    this.node.style.cursor = 'pointer';
    this.node.style.padding = '0 5px';
    this.node.setAttribute('role', 'button');
    this.node.addEventListener('click', onClick);
  }

  render(status, now) {
    this.node.textContent = itemText(status, now);
    this.node.title = itemTitle(status, now);
  }
}
