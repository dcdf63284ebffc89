package main

import (
	"fmt"
	"html"
	"math"
	"os"
	"strings"
)

// The charts are plain SVG written with fmt: horizontal bars, one group of
// bars per workload or sweep point, one bar per system, every bar labeled
// with its value.

type bar struct {
	system  string
	value   float64 // MiB/s
	text    string  // printed after the bar
	missing string  // printed instead of a bar when set
}

type group struct {
	label string
	bars  []bar
}

type panel struct {
	title  string
	groups []group
}

var barColors = map[string]string{
	"direct": "#8c8c8c", "local": "#8c8c8c", "local 4K": "#b0b0b0", "modelfs": "#1f6fb4", "rclone": "#e8790c", "s3fs": "#2a9a3a",
}

const (
	chartW     = 1030
	labelW     = 230 // bar labels, right-aligned before the bars
	valueW     = 260 // value text after the longest bar
	barH       = 18
	barGap     = 5
	groupGap   = 16
	panelHead  = 34
	axisH      = 44
	chartTop   = 62
	panelSpace = 24
)

// writeCharts writes base.svg, the headline comparison, and, when sweeps
// ran, base-sweeps.svg.
func writeCharts(rep *report, base string) error {
	rep.Charts = nil
	title := fmt.Sprintf("modelfs vs peers: %s model in %d shards, versitygw on loopback", mib(rep.ModelBytes), rep.Shards)
	sub := []string{fmt.Sprintf("%s · %s · best of %d (peers: best of %d) · higher is better", rep.Machine, rep.Date, rep.Repeat, rep.PeerRepeat)}
	var versions []string
	for _, s := range rep.Systems {
		versions = append(versions, s.Version)
	}
	if len(versions) > 0 {
		sub = append(sub, strings.Join(versions, " · ")+" · flags in the JSON beside this chart")
	}
	if svg := renderChart(title, sub, headlinePanels(rep)); svg != "" {
		if err := os.WriteFile(base+".svg", []byte(svg), 0o644); err != nil {
			return err
		}
		rep.Charts = append(rep.Charts, base+".svg")
	}
	if svg := renderChart("modelfs vs peers: how cost grows with the work", sub, sweepPanels(rep)); svg != "" {
		if err := os.WriteFile(base+"-sweeps.svg", []byte(svg), 0o644); err != nil {
			return err
		}
		rep.Charts = append(rep.Charts, base+"-sweeps.svg")
	}
	return nil
}

// headlinePanels: cold mmap load and cold cat for the direct ceiling and
// each system, then warm reload against the local page-cached copy.
func headlinePanels(rep *report) []panel {
	find := func(system, workload string) (row, bool) {
		for _, r := range rep.Rows {
			if r.Sweep == "" && r.System == system && r.Workload == workload {
				return r, true
			}
		}
		return row{}, false
	}
	systems := []string{"modelfs", "rclone", "s3fs"}
	missing := func(name string) string {
		for _, n := range rep.Skipped {
			if strings.HasPrefix(n, name+" ") {
				return "not installed"
			}
		}
		return "not measured"
	}
	var cold panel
	cold.title = "Cold read from S3, fresh mount (MiB/s, × the direct ceiling)"
	for _, w := range []string{"cold mmap load", "cold cat"} {
		g := group{label: w}
		if rep.Ceiling > 0 {
			g.bars = append(g.bars, bar{system: "direct", value: rep.Ceiling,
				text: fmt.Sprintf("%.0f MiB/s · ceiling", rep.Ceiling)})
		}
		for _, s := range systems {
			if r, ok := find(s, w); ok {
				g.bars = append(g.bars, bar{system: s, value: r.MiBps, text: fmt.Sprintf("%.0f MiB/s · %.2f×", r.MiBps, r.Ratio)})
			} else {
				g.bars = append(g.bars, bar{system: s, missing: missing(s)})
			}
		}
		cold.groups = append(cold.groups, g)
	}
	warm := panel{title: "Warm reload on the same mount (MiB/s, × the local page-cached copy)"}
	g := group{label: "warm reload"}
	if r, ok := find("local", "page-cached copy"); ok {
		g.bars = append(g.bars, bar{system: "local", value: r.MiBps, text: fmt.Sprintf("%.0f MiB/s · local copy", r.MiBps)})
	}
	if r, ok := find("local", "page-cached copy, 4 KiB pages"); ok {
		g.bars = append(g.bars, bar{system: "local 4K", value: r.MiBps, text: fmt.Sprintf("%.0f MiB/s · local copy in 4 KiB pages", r.MiBps)})
	}
	for _, s := range systems {
		if r, ok := find(s, "warm reload (same mount)"); ok {
			text := fmt.Sprintf("%.0f MiB/s · %.2f×", r.MiBps, r.RatioToLocal)
			if r.RatioToPaged > 0 {
				text += fmt.Sprintf(" · %.2f× in 4 KiB pages", r.RatioToPaged)
			}
			g.bars = append(g.bars, bar{system: s, value: r.MiBps, text: text})
		} else {
			g.bars = append(g.bars, bar{system: s, missing: missing(s)})
		}
	}
	warm.groups = append(warm.groups, g)
	var out []panel
	for _, p := range []panel{cold, warm} {
		if measured(p) {
			out = append(out, p)
		}
	}
	return out
}

// sweepPanels: one panel per sweep, one group per point.
func sweepPanels(rep *report) []panel {
	var out []panel
	for _, s := range rep.Sweeps {
		p := panel{title: "Sweep: " + sweepTitles[s] + " · MiB/s, × ceiling"}
		for _, r := range rep.Rows {
			if r.Sweep != s {
				continue
			}
			if len(p.groups) == 0 || p.groups[len(p.groups)-1].label != r.Point {
				p.groups = append(p.groups, group{label: r.Point})
			}
			g := &p.groups[len(p.groups)-1]
			text := fmt.Sprintf("%.0f MiB/s · %.2f×", r.MiBps, r.Ratio)
			if r.PeakRSS > 0 {
				text += fmt.Sprintf(" · RSS %.0f MiB", float64(r.PeakRSS)/(1<<20))
			}
			g.bars = append(g.bars, bar{system: r.System, value: r.MiBps, text: text})
		}
		if measured(p) {
			out = append(out, p)
		}
	}
	return out
}

// measured reports whether p has a bar for a mounted system.
func measured(p panel) bool {
	for _, g := range p.groups {
		for _, b := range g.bars {
			if b.missing == "" && b.value > 0 && b.system != "direct" && !strings.HasPrefix(b.system, "local") {
				return true
			}
		}
	}
	return false
}

// renderChart lays the panels out top to bottom, under a title and lines
// of subtitle; "" when there are no panels.
func renderChart(title string, subtitle []string, panels []panel) string {
	if len(panels) == 0 {
		return ""
	}
	var body strings.Builder
	y := chartTop + 15*(len(subtitle)-1)
	for _, p := range panels {
		y = renderPanel(&body, p, y) + panelSpace
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="DejaVu Sans, Helvetica, Arial, sans-serif" font-size="12">`+"\n",
		chartW, y, chartW, y)
	fmt.Fprintf(&sb, `<rect width="100%%" height="100%%" fill="#ffffff"/>`+"\n")
	fmt.Fprintf(&sb, `<text x="16" y="26" font-size="17" font-weight="bold">%s</text>`+"\n", html.EscapeString(title))
	for i, line := range subtitle {
		fmt.Fprintf(&sb, `<text x="16" y="%d" font-size="11" fill="#555">%s</text>`+"\n", 45+15*i, html.EscapeString(line))
	}
	sb.WriteString(body.String())
	sb.WriteString("</svg>\n")
	return sb.String()
}

// renderPanel draws p from y down and returns the y below it.
func renderPanel(sb *strings.Builder, p panel, y int) int {
	var top float64
	for _, g := range p.groups {
		for _, b := range g.bars {
			top = math.Max(top, b.value)
		}
	}
	axisMax, step := niceAxis(top)
	x0, x1 := labelW, chartW-valueW
	scale := func(v float64) float64 { return float64(x0) + v/axisMax*float64(x1-x0) }
	fmt.Fprintf(sb, `<text x="16" y="%d" font-size="14" font-weight="bold">%s</text>`+"\n", y+18, html.EscapeString(p.title))
	y += panelHead
	plotTop := y
	var bars strings.Builder
	for _, g := range p.groups {
		fmt.Fprintf(&bars, `<text x="16" y="%d" font-weight="bold">%s</text>`+"\n", y+13, html.EscapeString(g.label))
		y += barH + barGap
		for _, b := range g.bars {
			fmt.Fprintf(&bars, `<text x="%d" y="%d" text-anchor="end">%s</text>`+"\n", x0-8, y+13, html.EscapeString(b.system))
			if b.missing != "" {
				fmt.Fprintf(&bars, `<text x="%d" y="%d" fill="#888" font-style="italic">%s</text>`+"\n", x0+6, y+13, html.EscapeString(b.missing))
			} else {
				color := barColors[b.system]
				if color == "" {
					color = "#6a51a3"
				}
				end := scale(b.value)
				fmt.Fprintf(&bars, `<rect x="%d" y="%d" width="%.1f" height="%d" fill="%s"><title>%s %s: %s</title></rect>`+"\n",
					x0, y, end-float64(x0), barH, color, html.EscapeString(b.system), html.EscapeString(g.label), html.EscapeString(b.text))
				fmt.Fprintf(&bars, `<text x="%.1f" y="%d">%s</text>`+"\n", end+6, y+13, html.EscapeString(b.text))
			}
			y += barH + barGap
		}
		y += groupGap - barGap
	}
	plotBottom := y
	// Grid and axis first, bars over them.
	for v := 0.0; v <= axisMax+step/2; v += step {
		x := scale(v)
		fmt.Fprintf(sb, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#e3e3e3"/>`+"\n", x, plotTop, x, plotBottom)
		fmt.Fprintf(sb, `<text x="%.1f" y="%d" text-anchor="middle" fill="#444">%s</text>`+"\n", x, plotBottom+16, tick(v))
	}
	fmt.Fprintf(sb, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#333"/>`+"\n", x0, plotTop, x0, plotBottom)
	fmt.Fprintf(sb, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#333"/>`+"\n", x0, plotBottom, x1, plotBottom)
	fmt.Fprintf(sb, `<text x="%d" y="%d" text-anchor="middle" fill="#222">throughput, MiB/s</text>`+"\n", (x0+x1)/2, plotBottom+34)
	sb.WriteString(bars.String())
	return plotBottom + axisH
}

// niceAxis rounds top up to 1, 2, 2.5 or 5 × 10^k with 4 to 10 steps.
func niceAxis(top float64) (axisMax, step float64) {
	if top <= 0 {
		return 1, 0.25
	}
	mag := math.Pow(10, math.Floor(math.Log10(top)))
	for _, m := range []float64{0.1, 0.2, 0.25, 0.5, 1, 2, 2.5, 5, 10} {
		step = m * mag
		if math.Ceil(top/step) <= 8 {
			break
		}
	}
	return math.Ceil(top/step) * step, step
}

func tick(v float64) string {
	if v == math.Trunc(v) {
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%g", v)
}
