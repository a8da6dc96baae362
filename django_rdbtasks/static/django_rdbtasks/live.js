/* django-rdbtasks admin: live updates of the dashboard and the lists.
 *
 * Every few seconds the page fetches its own URL, parses the answer and swaps
 * the regions named by #rdbtasks-live (data-regions) in place: no reload, no
 * build step, no framework. It waits while the operator is busy with the page
 * (rows ticked, a field focused, text selected) and while the tab is hidden;
 * the toggle pauses it, and the browser remembers that; ?refresh=off starts
 * a page paused and ?refresh=N sets the interval (admin/live.py).
 */
'use strict';
{
    const STORAGE_KEY = 'django_rdbtasks.live';
    const FETCH_TIMEOUT = 30000;
    const CHECKBOXES = 'tr input.action-select';
    const FIELDS = 'select, textarea, [contenteditable], '
        + 'input:not([type=checkbox]):not([type=radio]):not([type=button]):not([type=submit])';

    // Django's actions.js binds the row checkboxes it finds when the page
    // loads. Rows swapped in later are new elements: hand it a list that is
    // read from the page each time instead, so "select all" and the counter
    // see the rows on screen. This file loads after actions.js and before
    // the page is parsed, so the wrapper is in place before actions.js runs.
    const liveCheckboxes = {
        get length() { return document.querySelectorAll(CHECKBOXES).length; },
        forEach(fn) { document.querySelectorAll(CHECKBOXES).forEach(fn); },
        [Symbol.iterator]() { return document.querySelectorAll(CHECKBOXES)[Symbol.iterator](); },
    };
    let boundTable = null;
    if (typeof window.Actions === 'function') {
        const actions = window.Actions;
        window.Actions = function(checkboxes, options) {
            boundTable = document.getElementById('result_list');
            return actions(liveCheckboxes, options);
        };
    }

    function stored() {
        try { return window.localStorage.getItem(STORAGE_KEY); } catch (e) { return null; }
    }

    function store(value) {
        try { window.localStorage.setItem(STORAGE_KEY, value); } catch (e) { /* private mode */ }
    }

    // The operator is working with what is on screen: do not move it.
    function busy() {
        if (document.querySelector(CHECKBOXES + ':checked, #action-toggle:checked')) {
            return true;
        }
        // A field being typed in or chosen from; a checkbox or a button keeps
        // the focus after a click, and only a ticked checkbox means anything.
        const active = document.activeElement;
        if (active && active.matches(FIELDS)) {
            return true;
        }
        const selection = window.getSelection && window.getSelection();
        return Boolean(selection && !selection.isCollapsed && String(selection).trim());
    }

    // The rows of a list: keep the table (actions.js listens on its body and
    // header), change its rows; anything else: the region's content.
    function swap(region, fresh) {
        const table = region.querySelector('#result_list');
        const freshTable = fresh.querySelector('#result_list');
        if (table && freshTable && table.tHead && freshTable.tHead
                && table.tHead.innerHTML === freshTable.tHead.innerHTML
                && table.tBodies.length === 1 && freshTable.tBodies.length === 1) {
            if (table.tBodies[0].innerHTML !== freshTable.tBodies[0].innerHTML) {
                table.tBodies[0].innerHTML = freshTable.tBodies[0].innerHTML;
            }
            return;
        }
        if (region.innerHTML !== fresh.innerHTML) {
            region.innerHTML = fresh.innerHTML;
        }
    }

    function apply(doc, selectors) {
        for (const selector of selectors) {
            const region = document.querySelector(selector);
            const fresh = doc.querySelector(selector);
            if (region && fresh) {
                swap(region, fresh);
            }
        }
        // The action bar's "0 of N selected" counts the rows of the page.
        const counter = document.querySelector('span.action-counter');
        const freshCounter = doc.querySelector('span.action-counter');
        if (counter && freshCounter) {
            counter.dataset.actionsIcnt = freshCounter.dataset.actionsIcnt;
            counter.textContent = freshCounter.textContent;
        }
        // A list that was empty has rows now: let actions.js bind them.
        const table = document.getElementById('result_list');
        if (table && table !== boundTable && document.querySelector(CHECKBOXES)
                && typeof window.Actions === 'function' && document.getElementById('action-toggle')
                && document.querySelector('#changelist-form button[name=index]')) {
            window.Actions(liveCheckboxes);
        }
        document.dispatchEvent(new CustomEvent('rdbtasks:updated'));
    }

    function start(toggle) {
        const interval = Math.max(1, Number(toggle.dataset.interval) || 5) * 1000;
        const selectors = (toggle.dataset.regions || '').split(/\s+/).filter(Boolean);
        let paused = toggle.hasAttribute('data-paused') || stored() === 'off';
        let timer = null;
        let failures = 0;
        let inFlight = null;

        function show(title) {
            toggle.textContent = paused ? toggle.dataset.labelOff : toggle.dataset.labelOn;
            toggle.setAttribute('aria-pressed', paused ? 'true' : 'false');
            toggle.title = title || (paused ? toggle.dataset.titleOff : toggle.dataset.titleOn);
        }

        function schedule(delay) {
            window.clearTimeout(timer);
            timer = paused ? null : window.setTimeout(tick, delay);
        }

        async function tick() {
            if (inFlight) {
                return;  // the fetch under way schedules the next one
            }
            if (document.hidden || busy()) {
                schedule(interval);
                return;
            }
            const controller = new AbortController();
            inFlight = controller;
            // A server that never answers must not stop the updates for good
            // unnoticed: give up on this fetch, count it as a failure.
            let timedOut = false;
            const deadline = window.setTimeout(function() {
                timedOut = true;
                controller.abort();
            }, Math.max(FETCH_TIMEOUT, interval * 3));
            try {
                const response = await fetch(window.location.href, {
                    credentials: 'same-origin',
                    cache: 'no-store',
                    headers: {'X-Requested-With': 'XMLHttpRequest'},
                    signal: controller.signal,
                });
                const url = new URL(response.url);
                if (url.pathname !== window.location.pathname || response.status === 401
                        || response.status === 403) {
                    // Logged out (sent to the login page) or no longer allowed:
                    // asking again cannot help. Stop until the operator says so.
                    paused = true;
                    show(toggle.dataset.titleStopped);
                    return;
                }
                if (!response.ok) {
                    throw new Error(String(response.status));
                }
                const html = await response.text();
                // The operator may have started something while it loaded.
                if (!paused && !busy()) {
                    apply(new DOMParser().parseFromString(html, 'text/html'), selectors);
                }
                failures = 0;
                show();
            } catch (error) {
                if (error.name === 'AbortError' && !timedOut) {
                    return;  // paused by the operator
                }
                failures += 1;
                show(toggle.dataset.titleFailed);
            } finally {
                window.clearTimeout(deadline);
                inFlight = null;
            }
            // Back off while the server fails: at most a minute between tries.
            schedule(Math.min(interval * 2 ** failures, 60000));
        }

        toggle.addEventListener('click', function() {
            paused = !paused;
            store(paused ? 'off' : 'on');
            if (paused && inFlight) {
                inFlight.abort();
            }
            show();
            schedule(0);
        });
        document.addEventListener('visibilitychange', function() {
            if (!document.hidden && !paused) {
                schedule(0);
            }
        });
        toggle.hidden = false;
        show();
        schedule(interval);
    }

    function ready() {
        const toggle = document.getElementById('rdbtasks-live');
        if (toggle) {
            start(toggle);
        }
    }

    if (document.readyState === 'loading') {
        document.addEventListener('DOMContentLoaded', ready);
    } else {
        ready();
    }
}
