package tools

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"image/png"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/client"
)

// The computer tool drives a sandbox's desktop (the desktop template):
// one tool whose action enum and arguments are those of Anthropic's
// computer-use tool (computer_20250124), plus open, so that a model's
// computer-use call runs here as it is. Every action is xdotool (or scrot,
// through the screenshot endpoint, or xdg-open) run as the sandbox's user
// on the display, with argv built from validated arguments: no shell.

// display is the desktop template's X display (E2B's desktop SDK's).
const display = ":0"

const (
	// maxTypeText bounds the text of one type action (typed at 12 ms a
	// character: about 50 s).
	maxTypeText = 4096
	// typeDelayMs is the delay between typed characters.
	typeDelayMs = 12
	// maxKeys bounds the key combinations of one key action.
	maxKeys = 16
	// maxScroll bounds scroll_amount.
	maxScroll = 50
	// maxWait and maxHold bound the duration of wait and hold_key.
	maxWait, maxHold = 60.0, 30.0
	// maxOpenTarget bounds the file or URL of open.
	maxOpenTarget = 2048
	// maxScreen bounds a coordinate before the screen's size is known.
	maxScreen = 16384
	// xdotoolTimeout bounds one xdotool run (a type gets more).
	xdotoolTimeout = 15
	// xdotoolOutput bounds what an xdotool run may print.
	xdotoolOutput = 64 << 10
	// openTimeout is how long an application open starts may run: the
	// server's default maximum.
	openTimeout = 24 * 3600
)

// Actions are the computer tool's actions.
var Actions = []string{
	"screenshot", "left_click", "right_click", "middle_click", "double_click", "triple_click",
	"mouse_move", "left_click_drag", "left_mouse_down", "left_mouse_up",
	"type", "key", "hold_key", "scroll", "cursor_position", "wait", "open",
}

func coordinate(desc string) map[string]any {
	return map[string]any{
		"type": "array", "description": desc, "minItems": 2, "maxItems": 2,
		"items": map[string]any{"type": "integer", "minimum": 0},
	}
}

var computerTool = Tool{
	Name: "computer",
	Description: "Use the sandbox's desktop (a sandbox of the desktop template: XFCE on display :0, " +
		"usually 1024x768) with the mouse and keyboard, and see it. Actions: screenshot (returns a PNG " +
		"and the screen's display_width_px and display_height_px; take one first and after actions to " +
		"see their effect); left_click, right_click, middle_click, double_click, triple_click (at " +
		"coordinate if given, else where the pointer is; text may name modifier keys to hold, e.g. " +
		"\"ctrl\" or \"shift+ctrl\"); mouse_move (to coordinate); left_click_drag (from start_coordinate " +
		"to coordinate); left_mouse_down, left_mouse_up; type (text, as typed on the keyboard); key " +
		"(text: an xdotool key combination or several separated by spaces, e.g. \"Return\", \"ctrl+s\", " +
		"\"alt+F4\", \"Page_Down\"); hold_key (text held down for duration seconds); scroll " +
		"(scroll_direction up, down, left or right, scroll_amount wheel clicks, at coordinate if given); " +
		"cursor_position (returns X=..,Y=..); wait (duration seconds, then a screenshot); open (text: a " +
		"file path or URL, opened with xdg-open in its default application). Coordinates are [x, y] in " +
		"screen pixels from the top left.",
	Schema: object(map[string]any{
		"action":           map[string]any{"type": "string", "enum": Actions, "description": "The action to perform."},
		"coordinate":       coordinate("[x, y] in pixels: where to click, move, scroll, or where a drag ends."),
		"start_coordinate": coordinate("[x, y] in pixels where left_click_drag starts."),
		"text": str("For type: the text; for key and hold_key: the keys (e.g. \"ctrl+s\"); for clicks and scroll: " +
			"modifier keys to hold; for open: the file or URL."),
		"scroll_direction": map[string]any{"type": "string", "enum": []string{"up", "down", "left", "right"}, "description": "For scroll: the direction."},
		"scroll_amount":    map[string]any{"type": "integer", "minimum": 1, "maximum": maxScroll, "description": "For scroll: how many wheel clicks (default 3)."},
		"duration":         map[string]any{"type": "number", "minimum": 0, "maximum": maxWait, "description": "For wait and hold_key: seconds."},
	}, "action"),
	desktop: true,
}

// computerArgs are the computer tool's arguments. Numbers are float64 so
// that a model's 512.0 is 512, and a fraction is an error rather than a
// decoding failure.
type computerArgs struct {
	Action          string    `json:"action"`
	Coordinate      []float64 `json:"coordinate"`
	StartCoordinate []float64 `json:"start_coordinate"`
	Text            *string   `json:"text"`
	ScrollDirection string    `json:"scroll_direction"`
	ScrollAmount    *float64  `json:"scroll_amount"`
	Duration        *float64  `json:"duration"`
}

// point is a screen coordinate.
type point struct{ x, y int }

func (p point) String() string { return fmt.Sprintf("(%d, %d)", p.x, p.y) }

// desk runs one computer action in sandbox id.
type desk struct {
	c  *client.Client
	id string
}

// computer runs one action of the computer tool.
func computer(ctx context.Context, c *client.Client, id string, args json.RawMessage) *api.ToolResult {
	var a computerArgs
	if res := decode(args, &a, "action"); res != nil {
		return res
	}
	if !slices.Contains(Actions, a.Action) {
		return failed(fmt.Sprintf("invalid arguments: action %q: want one of %s", clipArg(a.Action), strings.Join(Actions, ", ")))
	}
	if err := a.check(); err != nil {
		return failed("invalid arguments: " + err.Error())
	}
	d := desk{c, id}
	switch a.Action {
	case "screenshot":
		return d.screenshot(ctx)
	case "cursor_position":
		return d.cursorPosition(ctx)
	case "wait":
		if err := sleep(ctx, a.duration(1)); err != nil {
			return failed(err.Error())
		}
		return d.screenshot(ctx)
	case "type":
		return d.typeText(ctx, *a.Text)
	case "key":
		keys, err := keyCombos(*a.Text)
		if err != nil {
			return failed("invalid arguments: " + err.Error())
		}
		return d.run(ctx, "pressed "+strings.Join(keys, " "), append([]string{"key", "--clearmodifiers", "--"}, keys...)...)
	case "hold_key":
		return d.holdKey(ctx, *a.Text, a.duration(0))
	case "open":
		return d.open(ctx, *a.Text)
	case "left_mouse_down":
		return d.run(ctx, "left button down", "mousedown", "1")
	case "left_mouse_up":
		return d.run(ctx, "left button up", "mouseup", "1")
	}
	return d.pointer(ctx, a)
}

// check validates the arguments an action takes and needs.
func (a *computerArgs) check() error {
	var takes []string // beyond action
	switch a.Action {
	case "left_click", "right_click", "middle_click", "double_click", "triple_click":
		takes = []string{"coordinate", "text"}
	case "mouse_move":
		takes = []string{"coordinate*"}
	case "left_click_drag":
		takes = []string{"coordinate*", "start_coordinate*"}
	case "type", "key", "open":
		takes = []string{"text*"}
	case "hold_key":
		takes = []string{"text*", "duration*"}
	case "scroll":
		takes = []string{"coordinate", "text", "scroll_direction*", "scroll_amount"}
	case "wait":
		takes = []string{"duration"}
	}
	given := map[string]bool{
		"coordinate": a.Coordinate != nil, "start_coordinate": a.StartCoordinate != nil, "text": a.Text != nil,
		"scroll_direction": a.ScrollDirection != "", "scroll_amount": a.ScrollAmount != nil, "duration": a.Duration != nil,
	}
	for _, f := range []string{"coordinate", "start_coordinate", "text", "scroll_direction", "scroll_amount", "duration"} {
		switch {
		case slices.Contains(takes, f+"*") && !given[f]:
			return fmt.Errorf("%s needs %s", a.Action, f)
		case given[f] && !slices.Contains(takes, f) && !slices.Contains(takes, f+"*"):
			return fmt.Errorf("%s takes no %s", a.Action, f)
		}
	}
	for _, c := range [][]float64{a.Coordinate, a.StartCoordinate} {
		if c != nil {
			if _, err := toPoint(c); err != nil {
				return err
			}
		}
	}
	if a.ScrollDirection != "" && !slices.Contains([]string{"up", "down", "left", "right"}, a.ScrollDirection) {
		return fmt.Errorf("scroll_direction %q: want up, down, left or right", clipArg(a.ScrollDirection))
	}
	if n := a.ScrollAmount; n != nil && (*n != math.Trunc(*n) || *n < 1 || *n > maxScroll) {
		return fmt.Errorf("scroll_amount %v: want a whole number from 1 to %d", *n, maxScroll)
	}
	if d := a.Duration; d != nil {
		limit := maxWait
		if a.Action == "hold_key" {
			limit = maxHold
		}
		if !(*d >= 0 && *d <= limit) {
			return fmt.Errorf("duration %v: want seconds from 0 to %v", *d, limit)
		}
	}
	return nil
}

func (a *computerArgs) duration(def float64) time.Duration {
	if a.Duration != nil {
		def = *a.Duration
	}
	return time.Duration(def * float64(time.Second))
}

// toPoint checks a coordinate: two whole numbers within any screen.
func toPoint(c []float64) (point, error) {
	if len(c) != 2 {
		return point{}, fmt.Errorf("coordinate %v: want [x, y]", c)
	}
	for _, v := range c {
		if v != math.Trunc(v) || v < 0 || v >= maxScreen {
			return point{}, fmt.Errorf("coordinate %v: want [x, y], whole pixels from 0", c)
		}
	}
	return point{int(c[0]), int(c[1])}, nil
}

// pointer runs the clicks, moves, drags and scrolls: checked against the
// screen's size, then one xdotool run.
func (d desk) pointer(ctx context.Context, a computerArgs) *api.ToolResult {
	var w, h int
	if a.Coordinate != nil {
		var res *api.ToolResult
		if w, h, res = d.screenSize(ctx); res != nil {
			return res
		}
	}
	inside := func(c []float64) (point, bool, error) {
		if c == nil {
			return point{}, false, nil
		}
		p, _ := toPoint(c) // checked
		if p.x >= w || p.y >= h {
			return p, true, fmt.Errorf("coordinate %v is off the %dx%d screen: x must be below %d and y below %d", p, w, h, w, h)
		}
		return p, true, nil
	}
	to, hasTo, err := inside(a.Coordinate)
	if err != nil {
		return failed("invalid arguments: " + err.Error())
	}
	from, _, err := inside(a.StartCoordinate)
	if err != nil {
		return failed("invalid arguments: " + err.Error())
	}
	var mods []string
	if a.Text != nil {
		if mods, err = modifiers(*a.Text); err != nil {
			return failed("invalid arguments: " + err.Error())
		}
	}
	var argv []string
	// No mousemove --sync: it waits for the pointer to move, forever when
	// it is there already. One xdotool's requests reach the X server in
	// order, so the click lands where the move put the pointer.
	move := func(p point) { argv = append(argv, "mousemove", strconv.Itoa(p.x), strconv.Itoa(p.y)) }
	if hasTo && a.Action != "left_click_drag" {
		move(to)
	}
	for _, m := range mods {
		argv = append(argv, "keydown", m)
	}
	at := ""
	if hasTo {
		at = " at " + to.String()
	}
	var done string
	switch a.Action {
	case "mouse_move":
		done = "moved the pointer to " + to.String()
	case "left_click_drag":
		move(from)
		argv = append(argv, "mousedown", "1", "sleep", "0.1")
		move(to)
		argv = append(argv, "sleep", "0.1", "mouseup", "1")
		done = "dragged from " + from.String() + " to " + to.String()
	case "scroll":
		n := 3
		if a.ScrollAmount != nil {
			n = int(*a.ScrollAmount)
		}
		button := map[string]string{"up": "4", "down": "5", "left": "6", "right": "7"}[a.ScrollDirection]
		argv = append(argv, "click", "--repeat", strconv.Itoa(n), "--delay", "20", button)
		done = fmt.Sprintf("scrolled %s %d%s", a.ScrollDirection, n, at)
	default:
		clicks := map[string][]string{
			"left_click": {"1"}, "right_click": {"3"}, "middle_click": {"2"},
			"double_click": {"--repeat", "2", "--delay", "100", "1"}, "triple_click": {"--repeat", "3", "--delay", "100", "1"},
		}[a.Action]
		argv = append(append(argv, "click"), clicks...)
		done = strings.ReplaceAll(a.Action, "_", " ") + at
	}
	for _, m := range slices.Backward(mods) {
		argv = append(argv, "keyup", m)
	}
	return d.run(ctx, done, argv...)
}

// screenSize asks xdotool for the display's size.
func (d desk) screenSize(ctx context.Context) (w, h int, _ *api.ToolResult) {
	out, res := d.xdotool(ctx, xdotoolTimeout, "getdisplaygeometry")
	if res != nil {
		return 0, 0, res
	}
	f := strings.Fields(out)
	if len(f) == 2 {
		w, err1 := strconv.Atoi(f[0])
		h, err2 := strconv.Atoi(f[1])
		if err1 == nil && err2 == nil && w > 0 && h > 0 && w <= maxScreen && h <= maxScreen {
			return w, h, nil
		}
	}
	return 0, 0, failed("reading the screen's size: xdotool answered " + strconv.Quote(clipArg(out)))
}

// run runs xdotool with argv and answers done.
func (d desk) run(ctx context.Context, done string, argv ...string) *api.ToolResult {
	if _, res := d.xdotool(ctx, xdotoolTimeout, argv...); res != nil {
		return res
	}
	return text(done)
}

// xdotool runs xdotool with argv on the display as the sandbox's user
// and returns its stdout, or the tool error to answer with.
func (d desk) xdotool(ctx context.Context, timeout float64, argv ...string) (string, *api.ToolResult) {
	res, err := d.c.Output(ctx, d.id, api.CommandRequest{
		Args: append([]string{"xdotool"}, argv...), Env: map[string]string{"DISPLAY": display},
		Timeout: timeout, OutputLimit: xdotoolOutput, Tag: "computer",
	})
	if err != nil {
		if client.IsCode(err, api.CodeNotFound) && strings.Contains(err.Error(), "xdotool") {
			return "", failed("this sandbox has no xdotool: the computer tool needs a desktop sandbox (template desktop; " +
				"in MCP, create_sandbox with template \"desktop\")")
		}
		return "", failure(err)
	}
	if res.Exit.Code != 0 || res.Exit.Reason != "" {
		return "", desktopError(res)
	}
	// xdotool skips a key it does not know, says so, and exits 0.
	if i := strings.Index(res.Stderr, "No such key name"); i >= 0 {
		line, _, _ := strings.Cut(res.Stderr[i:], "\n")
		return "", failed("xdotool: " + clipArg(line) + " (key names are X keysyms such as Return, ctrl, a, F5, Page_Down)")
	}
	return res.Stdout, nil
}

// desktopError is the tool error of a failed xdotool run: most often
// there is no X server.
func desktopError(res *api.CommandResult) *api.ToolResult {
	if strings.Contains(res.Stderr, "Can't open display") || strings.Contains(res.Stderr, "open X display") {
		return failed("no X server on display " + display + " in this sandbox: the computer tool needs a desktop sandbox " +
			"(template desktop; in MCP, create_sandbox with template \"desktop\") whose desktop is up")
	}
	msg := fmt.Sprintf("xdotool exited with code %d", res.Exit.Code)
	if res.Exit.Reason == api.ExitTimeout {
		msg = "xdotool did not finish in time"
	}
	if s := strings.TrimSpace(res.Stderr); s != "" {
		msg += ": " + clip(s)
	}
	return failed(msg)
}

// screenshot answers with a PNG of the screen and its size.
func (d desk) screenshot(ctx context.Context) *api.ToolResult {
	b, err := d.c.Screenshot(ctx, d.id, display)
	if err != nil {
		return failure(err)
	}
	cfg, err := png.DecodeConfig(bytes.NewReader(b))
	if err != nil {
		return failed("the screenshot is no PNG: " + err.Error())
	}
	return &api.ToolResult{Content: []api.ToolContent{
		{Type: "text", Text: fmt.Sprintf("display_width_px: %d, display_height_px: %d", cfg.Width, cfg.Height)},
		{Type: "image", Data: base64.StdEncoding.EncodeToString(b), MIMEType: "image/png"},
	}}
}

var mouseRE = regexp.MustCompile(`(?m)^X=(\d{1,5})\nY=(\d{1,5})$`)

func (d desk) cursorPosition(ctx context.Context) *api.ToolResult {
	out, res := d.xdotool(ctx, xdotoolTimeout, "getmouselocation", "--shell")
	if res != nil {
		return res
	}
	m := mouseRE.FindStringSubmatch(out)
	if m == nil {
		return failed("reading the pointer's position: xdotool answered " + strconv.Quote(clipArg(out)))
	}
	return text("X=" + m[1] + ",Y=" + m[2])
}

// typeText types text as keystrokes.
func (d desk) typeText(ctx context.Context, s string) *api.ToolResult {
	if err := checkTyped(s); err != nil {
		return failed("invalid arguments: " + err.Error())
	}
	n := utf8.RuneCountInString(s)
	timeout := xdotoolTimeout + float64(n)*typeDelayMs*3/1000
	if _, res := d.xdotool(ctx, timeout, "type", "--delay", strconv.Itoa(typeDelayMs), "--", s); res != nil {
		return res
	}
	return text(fmt.Sprintf("typed %d characters", n))
}

// checkTyped checks the text of a type action: bounded, valid UTF-8,
// no control characters but newlines and tabs.
func checkTyped(s string) error {
	switch {
	case s == "":
		return fmt.Errorf("text is empty")
	case len(s) > maxTypeText:
		return fmt.Errorf("text of %d bytes: at most %d per type action", len(s), maxTypeText)
	case !utf8.ValidString(s):
		return fmt.Errorf("text is not valid UTF-8")
	}
	for _, r := range s {
		if unicode.IsControl(r) && r != '\n' && r != '\t' {
			return fmt.Errorf("text has the control character %U: only newlines and tabs may be typed", r)
		}
	}
	return nil
}

// keyAliases map the names models use for keys to X keysyms (xdotool
// itself knows ctrl, alt, shift and super).
var keyAliases = map[string]string{
	"enter": "Return", "return": "Return", "esc": "Escape", "escape": "Escape", "backspace": "BackSpace",
	"tab": "Tab", "space": "space", "delete": "Delete", "del": "Delete", "insert": "Insert",
	"home": "Home", "end": "End", "pageup": "Page_Up", "page_up": "Page_Up", "pagedown": "Page_Down",
	"page_down": "Page_Down", "up": "Up", "down": "Down", "left": "Left", "right": "Right",
	"arrowup": "Up", "arrowdown": "Down", "arrowleft": "Left", "arrowright": "Right",
	"control": "ctrl", "ctl": "ctrl", "cmd": "super", "command": "super", "win": "super", "meta": "super",
	"option": "alt", "capslock": "Caps_Lock", "printscreen": "Print",
}

var keyRE = regexp.MustCompile(`^[A-Za-z0-9_]{1,32}$`)

// keyCombos parses the text of a key action: combinations like ctrl+s,
// separated by spaces, each key a keysym name or an alias.
func keyCombos(s string) ([]string, error) {
	f := strings.Fields(s)
	if len(f) == 0 || len(f) > maxKeys {
		return nil, fmt.Errorf("keys %q: want 1 to %d key combinations such as ctrl+s, separated by spaces", clipArg(s), maxKeys)
	}
	for i, combo := range f {
		keys := strings.Split(combo, "+")
		if len(keys) > 6 {
			return nil, fmt.Errorf("key combination %q: at most 6 keys", clipArg(combo))
		}
		for j, k := range keys {
			if !keyRE.MatchString(k) {
				return nil, fmt.Errorf("key %q in %q: want a key name such as Return, ctrl, a, F5 or Page_Down (write + as plus)", clipArg(k), clipArg(combo))
			}
			if a, ok := keyAliases[strings.ToLower(k)]; ok {
				keys[j] = a
			}
		}
		f[i] = strings.Join(keys, "+")
	}
	return f, nil
}

// modifierKeys are the keys a click or scroll may hold.
var modifierKeys = []string{"shift", "ctrl", "alt", "super"}

// modifiers parses the modifier keys of a click or scroll, e.g.
// "shift+ctrl".
func modifiers(s string) ([]string, error) {
	var out []string
	for _, k := range strings.FieldsFunc(s, func(r rune) bool { return r == '+' || r == ' ' }) {
		k = strings.ToLower(k)
		if a, ok := keyAliases[k]; ok {
			k = a
		}
		if !slices.Contains(modifierKeys, k) {
			return nil, fmt.Errorf("modifier %q: want shift, ctrl, alt or super (e.g. \"shift+ctrl\")", clipArg(k))
		}
		out = append(out, k)
	}
	if len(out) > len(modifierKeys) {
		return nil, fmt.Errorf("modifiers %q: too many", clipArg(s))
	}
	return out, nil
}

// holdKey holds keys down for a while. The release runs even when ctx
// ends, so that no key stays down.
func (d desk) holdKey(ctx context.Context, keys string, dur time.Duration) *api.ToolResult {
	combos, err := keyCombos(keys)
	if err != nil {
		return failed("invalid arguments: " + err.Error())
	}
	if _, res := d.xdotool(ctx, xdotoolTimeout, append([]string{"keydown", "--"}, combos...)...); res != nil {
		return res
	}
	serr := sleep(ctx, dur)
	up, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*xdotoolTimeout*time.Second)
	defer cancel()
	if _, res := d.xdotool(up, xdotoolTimeout, append([]string{"keyup", "--"}, combos...)...); res != nil {
		return res
	}
	if serr != nil {
		return failed(serr.Error())
	}
	return text(fmt.Sprintf("held %s for %v", strings.Join(combos, " "), dur))
}

// open opens a file or URL with xdg-open, in the background: the
// application it starts lives on.
func (d desk) open(ctx context.Context, target string) *api.ToolResult {
	switch {
	case strings.TrimSpace(target) == "" || len(target) > maxOpenTarget:
		return failed(fmt.Sprintf("invalid arguments: open needs a file or URL of at most %d bytes", maxOpenTarget))
	case strings.HasPrefix(target, "-"):
		return failed("invalid arguments: the file or URL may not start with -")
	case !utf8.ValidString(target) || strings.ContainsFunc(target, unicode.IsControl):
		return failed("invalid arguments: the file or URL has control characters")
	}
	req := api.CommandRequest{
		Args: []string{"xdg-open", target}, Env: map[string]string{"DISPLAY": display},
		Timeout: openTimeout, Tag: "computer-open",
	}
	pid, err := d.c.Start(ctx, d.id, req)
	if client.IsCode(err, api.CodeInvalidArgument) { // a server whose maximum is lower
		req.Timeout = 0
		pid, err = d.c.Start(ctx, d.id, req)
	}
	if err != nil {
		if client.IsCode(err, api.CodeNotFound) && strings.Contains(err.Error(), "xdg-open") {
			return failed("this sandbox has no xdg-open: the computer tool needs a desktop sandbox (template desktop)")
		}
		return failure(err)
	}
	return text(fmt.Sprintf("opening %s (xdg-open, pid %d); take a screenshot to see it", target, pid))
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("interrupted: %w", ctx.Err())
	}
}

// clipArg shortens a model's argument for an error message.
func clipArg(s string) string {
	if len(s) > 64 {
		return strings.ToValidUTF8(s[:64], "") + "..."
	}
	return s
}
