# Kiln's IPython kernel startup (run with --IPKernelApp.exec_files).
#
# Registers two extra display formatters, so that rich results carry
# structured data besides their pictures and HTML:
#   e2b/data   a pandas DataFrame as {column: [values...]}
#   e2b/chart  a matplotlib Figure as a chart description (type, title,
#              axes, labels, units, ticks, scales and the plotted data,
#              without float noise)
# and makes PIL's Image.show() display the image (a PNG result).
#
# It also makes a flush of stdout/stderr with nothing unsent free, leaves
# out the IOPub messages the agent does not read, and sends IOPub messages
# from the main thread itself when nothing is queued for the IOPub thread
# (see _kiln_fast_flush, _kiln_quiet_iopub and _kiln_direct_iopub): fewer
# wake-ups of the kernel's threads, which are dear under gVisor.
# Neither formatter imports pandas or matplotlib: they are registered by name and
# used only once the user's code has made such an object. Everything is
# defined inside one function, so the user's namespace stays clean.


def _kiln_startup():
    import datetime
    import math
    import re
    import sys

    from IPython import get_ipython
    from IPython.core.formatters import BaseFormatter
    from traitlets import ObjectName, Unicode

    shell = get_ipython()
    if shell is None:
        return

    def plain(v):
        """v as a JSON-safe Python value."""
        if v is None or isinstance(v, (bool, str)):
            return v
        if isinstance(v, int):
            return v
        if isinstance(v, float):
            return v if math.isfinite(v) else None
        if isinstance(v, (datetime.datetime, datetime.date, datetime.time)):
            return v.isoformat()
        item = getattr(v, "item", None)  # numpy scalars
        if callable(item):
            try:
                return plain(item())
            except Exception:
                pass
        iso = getattr(v, "isoformat", None)  # pandas Timestamp
        if callable(iso):
            try:
                return iso()
            except Exception:
                pass
        if isinstance(v, (list, tuple)):
            return [plain(x) for x in v]
        if isinstance(v, dict):
            return {str(k): plain(x) for k, x in v.items()}
        try:
            if v != v:  # NaN-like (pandas NaT, NA)
                return None
        except Exception:
            pass
        return str(v)

    def num(v):
        """A chart's number without float noise: a value within 1e-7 of a
        decimal of at most 6 significant digits is that decimal (a pie
        wedge of 324 degrees is 324, not matplotlib's 323.99999141693115,
        and 0.1 + 0.2 is 0.3)."""
        v = plain(v)
        if isinstance(v, float) and math.isfinite(v) and v != int(v):
            r = float("%.6g" % v)
            if abs(r - v) <= 1e-7 * abs(v):
                return r
        return v

    def dataframe(df):
        return {str(col): [plain(x) for x in df[col].tolist()] for col in df.columns}

    # Charts.

    unit_re = re.compile(r"^(.*?)\s*[\(\[]([^\(\)\[\]]+)[\)\]]\s*$")

    def unit(label):
        m = unit_re.match(label or "")
        return m.group(2).strip() if m else None

    def text_or_none(s):
        return s if s else None

    def axis_kind(ax, which):
        """The scale of an axis: linear, log, ..., datetime or categorical."""
        axis = ax.xaxis if which == "x" else ax.yaxis
        try:
            import matplotlib.category as mcat
            import matplotlib.dates as mdates

            conv = axis.get_converter() if hasattr(axis, "get_converter") else axis.converter
            if isinstance(conv, mdates.DateConverter) or isinstance(conv, getattr(mdates, "_SwitchableDateConverter", ())):
                return "datetime"
            if isinstance(conv, mcat.StrCategoryConverter):
                return "categorical"
        except Exception:
            pass
        return ax.get_xscale() if which == "x" else ax.get_yscale()

    def value(ax, which, v, kind):
        """A data coordinate as the chart shows it."""
        if kind == "datetime":
            import matplotlib.dates as mdates

            try:
                return mdates.num2date(v).isoformat()
            except Exception:
                return num(v)
        if kind == "categorical":
            axis = ax.xaxis if which == "x" else ax.yaxis
            try:
                mapping = axis.units._mapping  # category -> position
                for name, pos in mapping.items():
                    if pos == v:
                        return str(name)
            except Exception:
                pass
        return num(v)

    def ticks(ax, which, kind):
        if which == "x":
            locs, labels = ax.get_xticks(), ax.get_xticklabels()
        else:
            locs, labels = ax.get_yticks(), ax.get_yticklabels()
        return [value(ax, which, float(t), kind) for t in locs], [l.get_text() for l in labels]

    def base(ax, kind):
        return {"type": kind, "title": text_or_none(ax.get_title()), "elements": []}

    def chart2d(ax, kind):
        c = base(ax, kind)
        xl, yl = ax.get_xlabel(), ax.get_ylabel()
        c.update({"x_label": text_or_none(xl), "y_label": text_or_none(yl), "x_unit": unit(xl), "y_unit": unit(yl)})
        return c

    def with_axes(ax, c):
        xk, yk = axis_kind(ax, "x"), axis_kind(ax, "y")
        c["x_ticks"], c["x_tick_labels"] = ticks(ax, "x", xk)
        c["y_ticks"], c["y_tick_labels"] = ticks(ax, "y", yk)
        c["x_scale"], c["y_scale"] = xk, yk
        return c, xk, yk

    def user_label(artist, fallback):
        label = artist.get_label() or ""
        return fallback if label.startswith("_") else label

    def line_chart(ax):
        c, xk, yk = with_axes(ax, chart2d(ax, "line"))
        for i, line in enumerate(ax.get_lines()):
            xs, ys = line.get_xdata(orig=False), line.get_ydata(orig=False)
            pts = [[value(ax, "x", float(x), xk), value(ax, "y", float(y), yk)] for x, y in zip(xs, ys)]
            c["elements"].append({"label": user_label(line, "line %d" % i), "points": pts})
        return c

    def scatter_chart(ax, collections):
        c, xk, yk = with_axes(ax, chart2d(ax, "scatter"))
        for i, coll in enumerate(collections):
            pts = [[value(ax, "x", float(x), xk), value(ax, "y", float(y), yk)] for x, y in coll.get_offsets()]
            c["elements"].append({"label": user_label(coll, "scatter %d" % i), "points": pts})
        return c

    def tick_label_at(ax, which, pos):
        locs = ax.get_xticks() if which == "x" else ax.get_yticks()
        labels = ax.get_xticklabels() if which == "x" else ax.get_yticklabels()
        best, dist = None, None
        for loc, lab in zip(locs, labels):
            d = abs(float(loc) - pos)
            if dist is None or d < dist:
                best, dist = lab.get_text(), d
        return best if best else num(pos)

    def bar_chart(ax, containers):
        c = chart2d(ax, "bar")
        for i, cont in enumerate(containers):
            group = user_label(cont, "group %d" % i)
            horizontal = getattr(cont, "orientation", "vertical") == "horizontal"
            for rect in cont:
                if horizontal:
                    label = tick_label_at(ax, "y", rect.get_y() + rect.get_height() / 2)
                    v = rect.get_width()
                else:
                    label = tick_label_at(ax, "x", rect.get_x() + rect.get_width() / 2)
                    v = rect.get_height()
                c["elements"].append({"label": label, "group": group, "value": num(float(v))})
        return c

    def pie_chart(ax, wedges):
        c = base(ax, "pie")
        for i, w in enumerate(wedges):
            c["elements"].append({"label": user_label(w, "slice %d" % i),
                                  "angle": num(float(w.theta2 - w.theta1)), "radius": num(float(w.r))})
        return c

    def box_chart(ax, boxes):
        """A vertical box plot: each box is a closed 5-point outline (or a
        patch), with whiskers, caps, a median and fliers at its centre."""
        c = chart2d(ax, "box_and_whisker")
        lines = ax.get_lines()
        for left, right, q1, q3 in boxes:
            mid = (left + right) / 2
            near = lambda x: abs(x - mid) <= (right - left) / 2 + 1e-9
            median, lo, hi, outliers = None, q1, q3, []
            for line in lines:
                xs = [float(x) for x in line.get_xdata(orig=False)]
                ys = [float(y) for y in line.get_ydata(orig=False)]
                if not xs or not all(near(x) for x in xs):
                    continue
                if line.get_linestyle() in ("None", "none", " ", ""):
                    outliers += ys
                elif len(xs) == 2 and xs[0] == xs[1]:  # a whisker
                    lo, hi = min(lo, *ys), max(hi, *ys)
                elif len(ys) == 2 and ys[0] == ys[1] and q1 < ys[0] < q3 and abs(xs[0] - xs[1]) >= (right - left) * 0.9:
                    median = ys[0]
            c["elements"].append({"label": tick_label_at(ax, "x", mid), "min": num(lo), "first_quartile": num(q1),
                                  "median": num(median if median is not None else (q1 + q3) / 2),
                                  "third_quartile": num(q3), "max": num(hi), "outliers": [num(o) for o in outliers]})
        return c

    def boxes_of(ax):
        from matplotlib.patches import PathPatch

        out = []
        for line in ax.get_lines():
            xs, ys = list(line.get_xdata(orig=False)), list(line.get_ydata(orig=False))
            if len(xs) == 5 and xs[0] == xs[4] and ys[0] == ys[4] and len(set(xs)) == 2 and len(set(ys)) == 2:
                out.append((float(min(xs)), float(max(xs)), float(min(ys)), float(max(ys))))
        for p in ax.patches:
            if isinstance(p, PathPatch):
                v = p.get_path().vertices
                xs, ys = set(float(x) for x in v[:, 0]), set(float(y) for y in v[:, 1])
                if len(xs) == 2 and len(ys) == 2:
                    out.append((min(xs), max(xs), min(ys), max(ys)))
        return sorted(out)

    def axes_chart(ax):
        from matplotlib.collections import PathCollection
        from matplotlib.container import BarContainer
        from matplotlib.patches import Wedge

        wedges = [p for p in ax.patches if isinstance(p, Wedge)]
        if wedges:
            return pie_chart(ax, wedges)
        bars = [b for b in ax.containers if isinstance(b, BarContainer)]
        if bars:
            return bar_chart(ax, bars)
        boxes = boxes_of(ax)
        if boxes:
            return box_chart(ax, boxes)
        points = [cl for cl in ax.collections if isinstance(cl, PathCollection)]
        if points and not ax.get_lines():
            return scatter_chart(ax, points)
        if ax.get_lines():
            return line_chart(ax)
        if points:
            return scatter_chart(ax, points)
        return None

    def figure(fig):
        charts = []
        for ax in fig.get_axes():
            try:
                ch = axes_chart(ax)
            except Exception:
                ch = None
            if ch is None:
                ch = {"type": "unknown", "title": text_or_none(ax.get_title()), "elements": []}
            charts.append(ch)
        if not any(ch["type"] != "unknown" or ch["title"] for ch in charts):
            return {}  # a blank figure
        if len(charts) == 1:
            return charts[0]
        title = fig._suptitle.get_text() if getattr(fig, "_suptitle", None) is not None else None
        return {"type": "superchart", "title": text_or_none(title), "elements": charts}

    class DataFormatter(BaseFormatter):
        format_type = Unicode("e2b/data")
        print_method = ObjectName("_repr_e2b_data_")
        _return_type = (dict,)

    class ChartFormatter(BaseFormatter):
        """Formats matplotlib figures. It recognises them itself rather
        than by registration: matplotlib's inline backend drops every
        formatter's Figure registration when pyplot is imported."""

        format_type = Unicode("e2b/chart")
        print_method = ObjectName("_repr_e2b_chart_")
        _return_type = (dict,)

        def __call__(self, obj):
            mfig = sys.modules.get("matplotlib.figure")
            if not self.enabled or mfig is None or not isinstance(obj, mfig.Figure):
                return None
            try:
                return figure(obj)
            except Exception:
                return None

    # PIL images: Image.show() displays the image, a PNG result (as
    # E2B's kernels do), rather than looking for an image viewer.
    try:
        from PIL import Image as pil_image
        from IPython.display import display

        def show(self, *args, **kwargs):
            display(self)

        pil_image.Image.show = show
    except Exception:  # no PIL
        pass

    formatters = shell.display_formatter.formatters
    data = DataFormatter(parent=shell.display_formatter)
    data.for_type_by_name("pandas.core.frame", "DataFrame", dataframe)
    formatters["e2b/data"] = data
    formatters["e2b/chart"] = ChartFormatter(parent=shell.display_formatter)


def _kiln_fast_flush():
    """ipykernel's OutStream.flush() (sys.stdout/sys.stderr), called from
    the kernel's main thread, hands two callbacks to the IOPub thread and
    waits for it to run them, even when nothing was written: ipykernel
    flushes both streams several times per execution (around the cell and
    after its result), so a `1+1` paid about twelve wake-ups of the IOPub
    thread through its zmq event pipe and six waits for it. Cheap on a
    plain kernel, but each cross-thread wake-up costs a lot more under
    gVisor, where they made up most of a warm `1+1`.

    Here each stream counts the writes that are in its buffer (gen, raised
    after the write has put its text there) and the writes the IOPub
    thread has taken out of the buffer and queued for sending (sent: the
    gen read before _flush takes the buffer, recorded once the send is
    queued). When they are equal, every write is already queued on the
    IOPub thread, ahead of anything the caller sends next (status idle
    included), which is all flush() has to guarantee; it returns at once.
    Otherwise (or with text in the buffer that was written before this
    patch) it does what it always did. Only ipykernel 6, whose OutStream
    this was read against.
    """
    import sys
    import threading

    import ipykernel
    from ipykernel.iostream import OutStream

    if ipykernel.version_info[0] != 6 or getattr(OutStream, "_kiln_gen", None) is not None:
        return
    for stream in (sys.stdout, sys.stderr):
        if not isinstance(stream, OutStream) or not all(
            hasattr(stream, a) for a in ("_buffer", "_buffer_lock", "_flush", "pub_thread")
        ):
            return
    write, flush_now, flush = OutStream.write, OutStream._flush, OutStream.flush
    OutStream._kiln_stock = (write, flush_now, flush)  # kiln bench compares
    OutStream._kiln_gen = 0
    OutStream._kiln_sent = 0

    def counted_write(self, string):
        n = write(self, string)
        with self._buffer_lock:
            self._kiln_gen += 1
        return n

    def counted_flush_now(self):
        with self._buffer_lock:
            gen = self._kiln_gen
        flush_now(self)
        with self._buffer_lock:
            self._kiln_sent = max(self._kiln_sent, gen)

    def fast_flush(self):
        thread = self.pub_thread and self.pub_thread.thread
        if thread is not None and thread.ident != threading.current_thread().ident:
            with self._buffer_lock:
                if self._kiln_sent == self._kiln_gen and not self._buffer.tell():
                    return
        flush(self)

    OutStream.write = counted_write
    OutStream._flush = counted_flush_now
    OutStream.flush = fast_flush


def _kiln_quiet_iopub():
    """The kernel's only client is Kiln's agent, which follows an
    execution by its results, streams, errors, reply and the final status
    idle. It ignores the status busy and the execute_input broadcast that
    ipykernel publishes for every request; not publishing them saves two of
    the four IOPub messages of a `1+1` (each one a wake-up of the IOPub
    thread and a message through the sandbox's loopback). Only ipykernel 6,
    whose Kernel methods these are.
    """
    import ipykernel
    from IPython import get_ipython

    kernel = getattr(get_ipython(), "kernel", None)
    if ipykernel.version_info[0] != 6 or kernel is None:
        return
    if not hasattr(kernel, "_publish_status") or not hasattr(kernel, "_publish_execute_input"):
        return
    publish_status = kernel._publish_status

    def status(state, channel, parent=None):
        if state != "busy":
            publish_status(state, channel, parent)

    kernel._publish_status = status
    kernel._publish_execute_input = lambda code, parent, execution_count: None


def _kiln_direct_iopub():
    """ipykernel hands every IOPub message to its IOPub thread (a queue and
    a wake-up through a zmq event pipe), which then hands it to libzmq's
    I/O thread: two cross-thread wake-ups per message, each dear under
    gVisor. Here a thread other than the IOPub thread sends a message on
    the IOPub socket itself when nothing is queued for the IOPub thread,
    so a `1+1`'s result and status idle skip that thread.

    One re-entrant lock guards the socket and a count of the events
    queued for the IOPub thread (sends, flushes, anything scheduled there):
    the thread runs each event holding it, and a direct send happens only
    under it with the count at zero. So a direct send never overtakes
    anything queued before it (the text of a stream that a flush queued,
    for one), and the socket is never used by two threads at once (the
    thread's own sends run inside its events). Only sends go direct;
    everything else still runs on the IOPub thread. Only ipykernel 6,
    whose IOPubThread this was read against.
    """
    import threading

    import ipykernel
    from ipykernel.iostream import IOPubThread
    from IPython import get_ipython

    kernel = getattr(get_ipython(), "kernel", None)
    if ipykernel.version_info[0] != 6 or kernel is None:
        return
    pub = getattr(kernel, "iopub_thread", None)
    if not isinstance(pub, IOPubThread) or "schedule" in pub.__dict__:
        return
    if not all(hasattr(pub, a) for a in ("thread", "schedule", "_really_send")):
        return
    schedule, really_send = pub.schedule, pub._really_send
    lock = threading.RLock()
    queued = [0]
    pub._kiln_counts = counts = {"queued": 0, "direct": 0}  # tests read these

    def counted_schedule(f):
        if not pub.thread.is_alive():  # not started, stopped, or a forked child
            return f()

        def event():
            with lock:
                try:
                    f()
                finally:
                    queued[0] -= 1

        with lock:
            queued[0] += 1
            counts["queued"] += 1
            schedule(event)

    def send_multipart(*args, **kwargs):
        thread = pub.thread
        if thread.is_alive() and threading.current_thread() is not thread:
            with lock:
                if queued[0] == 0:
                    counts["direct"] += 1
                    return really_send(*args, **kwargs)
        counted_schedule(lambda: really_send(*args, **kwargs))

    pub.schedule, pub.send_multipart = counted_schedule, send_multipart
    # ipykernel sleeps 0.5 ms before every execute_reply in case "the
    # flush doesn't make it to the clients"; the agent waits for the
    # status idle, which follows all of a cell's output on the one IOPub
    # socket, so the sleep buys nothing here.
    if hasattr(kernel, "_execute_sleep"):
        kernel._execute_sleep = 0


def _kiln_reply_in_idle():
    """The agent ends an execution when it has both the execute_reply
    (shell socket) and the status idle (IOPub socket, after all of the
    cell's output). ipykernel sends the reply first but through a
    ZMQStream that queues it for a later turn of the event loop, so under
    gVisor it reached the agent ~0.5 ms after the idle. Here the status
    idle that ends an execute_request carries what the agent reads of the
    reply (status, execution count, error) as "kiln_execute_reply", and
    the agent ends on it; the reply itself is still sent as before. Only
    ipykernel 6, whose Kernel._publish_status this replaces for that one
    message.
    """
    import ipykernel
    from IPython import get_ipython

    kernel = getattr(get_ipython(), "kernel", None)
    if ipykernel.version_info[0] != 6 or kernel is None:
        return
    session = getattr(kernel, "session", None)
    if session is None or "send" in session.__dict__:
        return
    if not all(hasattr(kernel, a) for a in ("_publish_status", "_topic", "get_parent", "iopub_socket")):
        return
    send, publish_status = session.send, kernel._publish_status
    last = {}  # the last execute_reply: the request's msg_id and what the agent reads

    def remembering_send(stream, msg_or_type, content=None, parent=None, *args, **kwargs):
        msg = send(stream, msg_or_type, content, parent, *args, **kwargs)
        if msg_or_type == "execute_reply" and isinstance(msg, dict) and isinstance(parent, dict):
            c = msg.get("content") or {}
            last["id"] = parent.get("header", {}).get("msg_id")
            last["reply"] = {k: c[k] for k in ("status", "execution_count", "ename", "evalue", "traceback") if k in c}
        return msg

    def status(state, channel, parent=None):
        if state == "idle" and channel == "shell":
            parent = parent or kernel.get_parent(channel)
            reply, request = last.pop("reply", None), last.pop("id", None)
            if reply is not None and isinstance(parent, dict) and request == parent.get("header", {}).get("msg_id"):
                send(kernel.iopub_socket, "status", {"execution_state": "idle", "kiln_execute_reply": reply},
                     parent=parent, ident=kernel._topic("status"))
                return
        publish_status(state, channel, parent)

    session.send, kernel._publish_status = remembering_send, status


for _kiln_f in (_kiln_startup, _kiln_fast_flush, _kiln_quiet_iopub, _kiln_direct_iopub, _kiln_reply_in_idle):
    try:
        _kiln_f()
    except Exception:  # a kernel without IPython's display machinery
        pass
del _kiln_startup, _kiln_fast_flush, _kiln_quiet_iopub, _kiln_direct_iopub, _kiln_reply_in_idle, _kiln_f
