// The JupyterLab half of gpuspawner's cull warning and GPU load: poll this
// server's /gpuspawner/warning and /gpuspawner/gpu-status (the server extension
// asks gpuspawner-culler with the server's own hub token), show one
// notification per warning and a status-bar item for this server's GPUs. The
// warning's "Keep for 1 h" buttons post to /gpuspawner/keep (forwarded to the
// culler's /api/keep with the same token).
import { Notification } from '@jupyterlab/apputils';
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';
import { IStatusBar } from '@jupyterlab/statusbar';

import { GpuItem, GpuPanel } from './gpustatus';

// Used until the server says how often to ask (poll_seconds in its answer).
const DEFAULT_POLL_SECONDS = 60;

/** The notification's text: when, why and how to keep the server. */
export function warningMessage(warning) {
  const at = new Date(warning.cull_at * 1000).toLocaleTimeString([], {
    hour: '2-digit',
    minute: '2-digit'
  });
  return `This server will be stopped at ${at} because ${warning.why}. ${warning.keep}`;
}

/** A keep choice's button text: "Keep for 1 h", "Keep for 90 min". */
export function keepLabel(seconds) {
  seconds = Math.floor(seconds);
  if (seconds >= 3600 && seconds % 3600 === 0) {
    return `Keep for ${seconds / 3600} h`;
  }
  return `Keep for ${Math.max(1, Math.round(seconds / 60))} min`;
}

/** What the notification says once kept, in the reader's local time as the warning. */
export function keptMessage(until) {
  const at = new Date(until * 1000).toLocaleTimeString([], {
    hour: '2-digit',
    minute: '2-digit'
  });
  return `Kept until ${at}.`;
}

/** The culler's keep choices (seconds) on a warning: whole positive numbers only. */
function keepChoices(warning) {
  const choices = Array.isArray(warning.keep_choices) ? warning.keep_choices : [];
  return choices.filter(s => typeof s === 'number' && Number.isFinite(s) && s > 0);
}

const plugin = {
  id: 'gpuspawner-jupyterlab:cull-warning',
  description: 'Shows gpuspawner-culler\'s warning before it stops this server.',
  autoStart: true,
  activate: app => {
    const settings = app.serviceManager.serverSettings;
    const url = URLExt.join(settings.baseUrl, 'gpuspawner', 'warning');
    const keepUrl = URLExt.join(settings.baseUrl, 'gpuspawner', 'keep');
    // warning key -> notification id: one notification per warning, not per poll
    const shown = new Map();

    // warnings already answered by a keep: not shown again while the culler withdraws them
    const kept = new Set();

    // Ask for the keep; the notification then says until when, or why not (and offers
    // the choices again).
    const keep = async (key, id, seconds, actions) => {
      let answer = null;
      let ok = false;
      try {
        const response = await ServerConnection.makeRequest(
          keepUrl,
          { method: 'POST', body: JSON.stringify({ seconds }) },
          settings
        );
        ok = response.ok;
        answer = await response.json().catch(() => null);
      } catch (error) {
        answer = null;
      }
      if (ok && answer && typeof answer.until === 'number') {
        kept.add(key);
        shown.delete(key); // the next poll must not dismiss the answer
        Notification.update({
          id,
          message: keptMessage(answer.until),
          type: 'success',
          autoClose: 10000,
          actions: []
        });
        return;
      }
      const message =
        (answer && typeof answer.message === 'string' && answer.message) ||
        'The culler did not answer, so this server is not kept; try again in a minute.';
      Notification.update({ id, message, type: 'error', autoClose: false, actions });
    };

    const notify = (key, warning) => {
      // why it cannot be kept replaces how to keep it: a toast shows 140 characters
      const refused = typeof warning.keep_refused === 'string' ? warning.keep_refused : '';
      const message = warningMessage(refused ? { ...warning, keep: refused } : warning);
      let id = null;
      const actions = keepChoices(warning).map(seconds => ({
        label: keepLabel(seconds),
        callback: event => {
          event.preventDefault(); // the toast stays open for the answer
          void keep(key, id, seconds, actions);
        }
      }));
      id = Notification.warning(message, { autoClose: false, actions });
      return id;
    };

    const show = answer => {
      const warning = answer.warning;
      const key = warning ? `${warning.server}@${warning.warned_at}` : null;
      for (const [old, id] of shown) {
        if (old !== key) {
          Notification.dismiss(id); // used again: that warning is over
          shown.delete(old);
        }
      }
      if (warning && !shown.has(key) && !kept.has(key)) {
        shown.set(key, notify(key, warning));
      }
    };

    const poll = async () => {
      let next = DEFAULT_POLL_SECONDS;
      try {
        let response;
        try {
          response = await ServerConnection.makeRequest(url, {}, settings);
        } catch (error) {
          return; // the server is restarting or the network blinked: ask again later
        }
        if (response.status === 404) {
          next = null; // the server part is not installed here: nothing to ask
        } else if (response.ok) {
          const answer = await response.json();
          next = answer.poll_seconds || next;
          show(answer);
        }
      } finally {
        if (next !== null) {
          setTimeout(poll, next * 1000);
        }
      }
    };
    // toasts appear only once the shell is up: a notification sent earlier
    // would wait silently in the notification centre
    void app.restored.then(poll);
  }
};

// Used until the server says how often to ask for the GPU status.
const DEFAULT_GPU_POLL_SECONDS = 30;

const gpuStatusPlugin = {
  id: 'gpuspawner-jupyterlab:gpu-status',
  description: "This server's GPU load and the culler's rule, in the status bar.",
  autoStart: true,
  requires: [IStatusBar],
  activate: (app, statusBar) => {
    const settings = app.serviceManager.serverSettings;
    const url = URLExt.join(settings.baseUrl, 'gpuspawner', 'gpu-status');
    let status = null; // the last figures: kept while asking fails
    let registration = null; // the item is in the status bar only while there is a status
    let panel = null;

    const now = () => Date.now() / 1000;
    const openPanel = () => {
      if (!panel || panel.isDisposed) {
        panel = new GpuPanel();
      }
      panel.render(status, now());
      if (!panel.isAttached) {
        app.shell.add(panel, 'main');
      }
      app.shell.activateById(panel.id);
    };
    let item = null;

    const show = () => {
      if (status === null) {
        if (registration) {
          registration.dispose(); // a CPU server, or no culler: no item at all
          registration = null;
        }
      } else {
        if (!registration) {
          // the status bar disposes an item it lets go of: a new one each time
          item = new GpuItem(openPanel);
          registration = statusBar.registerStatusItem(gpuStatusPlugin.id, {
            item,
            align: 'left',
            rank: 100
          });
        }
        item.render(status, now());
      }
      if (panel && !panel.isDisposed && panel.isAttached) {
        panel.render(status, now());
      }
    };

    const poll = async () => {
      let next = DEFAULT_GPU_POLL_SECONDS;
      try {
        let response;
        try {
          response = await ServerConnection.makeRequest(url, {}, settings);
        } catch (error) {
          return; // the server is restarting or the network blinked: keep the figures
        }
        if (response.status === 404) {
          next = null; // the server part is not installed here: nothing to ask
        } else {
          const answer = await response.json().catch(() => null);
          next = (answer && answer.poll_seconds) || next;
          if (response.ok && answer) {
            status = answer.status || null;
          }
          // not ok (the culler is unreachable for now): keep the last figures
        }
        show();
      } finally {
        if (next !== null) {
          setTimeout(poll, next * 1000);
        }
      }
    };
    void app.restored.then(poll);
  }
};

export default [plugin, gpuStatusPlugin];
